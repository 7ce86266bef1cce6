"""Tables and requests for bench/peers/llama-cpp.sh (standard library only).

  tables.py decode DIR MODEL...          llama-bench and runtime-bench JSON -> markdown
  tables.py request PROMPT.json PORT     one greedy /completion on llama-server -> JSON
  tables.py server DIR HISTORY TARGET NGRAM   ours vs llama-server -> markdown
"""

import json
import os
import platform
import statistics
import subprocess
import sys
import time
import urllib.request


def cpu():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def built_with():
    out = subprocess.run(
        ["bash", os.path.join(os.path.dirname(__file__), "llama-cpp.sh"), "build"],
        capture_output=True, text=True, check=True,
    ).stdout
    return out.strip()


def machine():
    """The lines every table opens with: CPU, threads and what llama.cpp was built with."""
    threads = os.environ.get("THREADS", "2")
    return [f"CPU: {cpu()}, threads: {threads}", "", "```", built_with(), "```", ""]


def llama_ts(records, n_prompt, n_gen, depth):
    """Median tokens/s of llama-bench's test (n_prompt, n_gen) at `depth`."""
    for r in records:
        if r["n_prompt"] == n_prompt and r["n_gen"] == n_gen and r.get("n_depth", 0) == depth:
            samples = r.get("samples_ts") or [r["avg_ts"]]
            return statistics.median(samples)
    return None


def rounds(d, m, side):
    """Every round's JSON of one side (`llama` or `ours`) for model `m`, in round order."""
    found = []
    r = 1
    while os.path.exists(os.path.join(d, f"{m}.{side}.{r}.json")):
        with open(os.path.join(d, f"{m}.{side}.{r}.json")) as f:
            found.append(json.load(f))
        r += 1
    return found


def spread(xs):
    """Median, and the range when there is more than one value."""
    med = statistics.median(xs)
    return med, (f"{min(xs):.1f}–{max(xs):.1f}" if len(xs) > 1 else "")


def decode(d, models):
    rows, steps, n = [], [], 0
    for m in models:
        llama = rounds(d, m, "llama")
        ours = [o[0] for o in rounds(d, m, "ours")]
        n = max(n, len(ours))
        for i, (depth, _) in enumerate(ours[0]["decode"]):
            mine = [o["decode"][i][1] for o in ours]
            peer = [t for t in (llama_ts(l, 0, 128, depth) for l in llama) if t]
            rows.append((m, f"decode 128 tok/s, depth {depth}", mine, peer))
        for i, (p, _) in enumerate(ours[0]["prefill"]):
            mine = [o["prefill"][i][1] for o in ours]
            peer = [t for t in (llama_ts(l, p, 0, 0) for l in llama) if t]
            rows.append((m, f"prefill {p} tok/s", mine, peer))
        st = [o["step"] for o in ours if o.get("step")]
        if st:
            steps.append((m, st[0][0], [s[1] for s in st], [s[2] for s in st]))
    out = [
        "# Decode and prefill beside llama.cpp, same GGUF files, same sitting",
        "",
        "Command: `bash bench/peers/llama-cpp.sh decode " + " ".join(models) + "`",
        f"({n} rounds per model, each one llama-bench `-p 512 -n 128 -d 0,4096 -r 1` and then "
        "our `runtime-bench --prefill 512 --decode 128 --decode-depths 0,4096 --runs 1 "
        "--no-reference --no-dense`; medians over the rounds, the range beside them).",
        "",
        *machine(),
        "| model | figure | speccompact | range | llama.cpp | range | ours ÷ theirs |",
        "|---|---|---|---|---|---|---|",
    ]
    for m, what, mine, peer in rows:
        ts, r1 = spread(mine)
        if peer:
            theirs, r2 = spread(peer)
            out.append(f"| {m} | {what} | {ts:.1f} | {r1} | {theirs:.1f} | {r2} | {ts / theirs:.2f}× |")
        else:
            out.append(f"| {m} | {what} | {ts:.1f} | {r1} | n/a |  |  |")
    out += [
        "",
        "Our decode step over a shared prefix, one row and six rows (runtime-bench: median of 5 "
        "forwards per round; medians over the rounds; the ratio is the median of each round's "
        "ratio, both measured in one process):",
        "",
        "| model | prefix | 1 row ms | 6 rows ms | 6 rows ÷ 1 row | range of the ratio |",
        "|---|---|---|---|---|---|",
    ]
    for m, depth, one, six in steps:
        ratios = [s / o for o, s in zip(one, six)]
        r, rr = statistics.median(ratios), (f"{min(ratios):.2f}–{max(ratios):.2f}×" if len(ratios) > 1 else "")
        out.append(
            f"| {m} | {depth} | {statistics.median(one):.1f} | {statistics.median(six):.1f} | {r:.2f}× | {rr} |"
        )
    print("\n".join(out))


def request(prompt_file, port):
    with open(prompt_file) as f:
        p = json.load(f)
    body = {
        "prompt": p["tokens"],
        "n_predict": p["max_tokens"],
        "temperature": 0.0,
        "top_k": 1,
        "samplers": ["top_k"],
        "cache_prompt": False,
        "stream": False,
    }
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/completion",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    t = time.monotonic()
    with urllib.request.urlopen(req, timeout=3600) as r:
        resp = json.load(r)
    resp["wall_s"] = time.monotonic() - t
    print(json.dumps(resp))


def server(d, history, target, ngram):
    def load(name):
        with open(os.path.join(d, name)) as f:
            return json.load(f)

    prompt = load("prompt.json")
    rows = []
    for mode in ("off", "auto"):
        o = load(f"ours-{mode}.json")
        t = o["trace"]
        decode_s = t["repair_ms"] / 1e3
        lk = t.get("lookup", {}).get("target", {})
        rows.append((
            f"speccompact sequential, lookup {mode}",
            t["wall_ms"] / 1e3,
            t["target_prefix_tokens"], t["prefill_ms"] / 1e3,
            t["target_tokens"], decode_s,
            f"{lk.get('kept', 0)} of {lk.get('drafted', 0)}" if lk else "",
            o["markdown"],
        ))
    for variant in ("plain", "ngram"):
        r = load(f"peer-{variant}.json")
        tm = r["timings"]
        drafted = tm.get("draft_n")
        rows.append((
            "llama-server" + (f", {ngram}" if variant == "ngram" else ""),
            r["wall_s"],
            tm["prompt_n"], tm["prompt_ms"] / 1e3,
            tm["predicted_n"], tm["predicted_ms"] / 1e3,
            f"{tm.get('draft_n_accepted', 0)} of {drafted}" if drafted else "",
            r["content"],
        ))
    out = [
        "# One-call summary: speccompact's sequential method and llama-server, same prompt tokens",
        "",
        f"Command: `bash bench/peers/llama-cpp.sh server {os.path.relpath(history)}` "
        f"(TARGET={target}); the prompt is `speccompact compact --method sequential "
        "--prompt-only` sent to `/completion` as token ids, greedy, no prompt cache.",
        "",
        *machine(),
        f"Prompt: {len(prompt['tokens'])} tokens, at most {prompt['max_tokens']} new.",
        "",
        "| run | wall s | prefill tokens | prefill s | prefill tok/s | decode tokens | decode s "
        "| decode tok/s | drafts kept | same lines as ours (lookup off) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    def lines(text):
        # Ours is re-assembled under the slot headings; compare the lines, not the layout.
        return [l.strip().lstrip("#").strip() for l in text.splitlines() if l.strip()]

    ref = lines(rows[0][7])
    for name, wall, pn, ps, dn, ds, kept, text in rows:
        same = "yes" if lines(text) == ref else "no"
        out.append(
            f"| {name} | {wall:.1f} | {pn} | {ps:.1f} | {pn / max(ps, 1e-9):.1f} | {dn} | "
            f"{ds:.1f} | {dn / max(ds, 1e-9):.1f} | {kept} | {same} |"
        )
    out += ["", "Texts:", ""]
    for name, *_, text in rows:
        out += [f"<details><summary>{name}</summary>", "", "```", text.strip(), "```", "</details>", ""]
    print("\n".join(out))


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "decode":
        decode(args[0], args[1:])
    elif cmd == "request":
        request(args[0], args[1])
    elif cmd == "server":
        server(*args)
    else:
        sys.exit(f"tables.py: unknown command {cmd}")
