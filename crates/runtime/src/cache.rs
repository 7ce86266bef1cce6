//! The KV cache: an immutable, shared [`Prefix`] and per-sequence suffixes.
//!
//! A prefix is computed once and frozen; any number of [`Sequence`]s reference it through an
//! `Arc` and never copy it. Each sequence owns only the keys and values of its own suffix,
//! which can be extended (by a forward), rolled back to a length, forked and dropped.
//! A suffix lives in buffers with room to grow, written in place as the sequence extends;
//! forks share the buffers, and of two sequences extending past the positions they share,
//! the first writes in place and the other copies into buffers of its own.

use crate::{Error, Result};
use candle_core::Tensor;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Keys and values of one layer, each of shape (kv_heads, len, head_dim).
#[derive(Debug, Clone)]
pub struct LayerKv {
    /// Keys (after rope).
    pub k: Tensor,
    /// Values.
    pub v: Tensor,
}

impl LayerKv {
    fn len(&self) -> usize {
        self.k.dims()[1]
    }

    fn narrow(&self, len: usize) -> Result<Self> {
        Ok(Self {
            k: self.k.narrow(1, 0, len)?,
            v: self.v.narrow(1, 0, len)?,
        })
    }

    fn bytes(&self) -> usize {
        (self.k.elem_count() + self.v.elem_count()) * self.k.dtype().size_in_bytes()
    }
}

/// Positions a suffix buffer holds at least.
const MIN_CAPACITY: usize = 16;

/// One layer's suffix: views of the first positions of buffers (kv_heads, capacity,
/// head_dim) that forks share. `written` counts the buffer positions any sharer has written;
/// a sequence writes past its own length in place only while that count equals it (nobody
/// else's view reaches further), and otherwise copies into new buffers.
#[derive(Debug, Clone)]
struct Suffix {
    view: LayerKv,
    k: Tensor,
    v: Tensor,
    written: Arc<AtomicUsize>,
}

impl Suffix {
    /// A suffix holding `k`, `v` (kv_heads, n, head_dim).
    fn new(k: &Tensor, v: &Tensor) -> Result<Self> {
        let n = k.dims()[1];
        let cap = n.max(MIN_CAPACITY);
        let mut s = Self {
            view: LayerKv {
                k: k.narrow(1, 0, 0)?,
                v: v.narrow(1, 0, 0)?,
            },
            k: grown(k, 0, cap)?,
            v: grown(v, 0, cap)?,
            written: Arc::new(AtomicUsize::new(n)),
        };
        s.write(k, v, 0)?;
        Ok(s)
    }

    /// Appends `k`, `v` (kv_heads, n, head_dim) after the suffix's positions.
    fn extend(&mut self, k: &Tensor, v: &Tensor) -> Result<()> {
        let (len, n) = (self.view.len(), k.dims()[1]);
        let in_place = len + n <= self.k.dims()[1]
            && self
                .written
                .compare_exchange(len, len + n, Ordering::AcqRel, Ordering::Acquire)
                .is_ok();
        if !in_place {
            let cap = (len + n).max(2 * len).max(MIN_CAPACITY);
            let (bk, bv) = (
                grown(&self.view.k, len, cap)?,
                grown(&self.view.v, len, cap)?,
            );
            (self.k, self.v) = (bk, bv);
            self.written = Arc::new(AtomicUsize::new(len + n));
        }
        self.write(k, v, len)
    }

    /// Writes `k`, `v` at buffer position `at` and makes the view end after them.
    fn write(&mut self, k: &Tensor, v: &Tensor, at: usize) -> Result<()> {
        self.k.slice_set(k, 1, at)?;
        self.v.slice_set(v, 1, at)?;
        let len = at + k.dims()[1];
        self.view = LayerKv {
            k: self.k.narrow(1, 0, len)?,
            v: self.v.narrow(1, 0, len)?,
        };
        Ok(())
    }

    /// Keeps the first `keep` positions; the buffers are reused when no fork shares them.
    fn truncate(&mut self, keep: usize) -> Result<()> {
        self.view = self.view.narrow(keep)?;
        if Arc::strong_count(&self.written) == 1 {
            self.written.store(keep, Ordering::Release);
        }
        Ok(())
    }
}

/// A new buffer of `cap` positions shaped like `t` (kv_heads, _, head_dim), holding `t`'s
/// first `len` positions.
fn grown(t: &Tensor, len: usize, cap: usize) -> Result<Tensor> {
    let (h, hd) = (t.dims()[0], t.dims()[2]);
    let buf = Tensor::zeros((h, cap, hd), t.dtype(), t.device())?;
    if len > 0 {
        buf.slice_set(&t.narrow(1, 0, len)?.contiguous()?, 1, 0)?;
    }
    Ok(buf)
}

/// `t` in storage of its own (a frozen prefix must not share a buffer a fork writes into).
fn own_storage(t: &Tensor) -> Result<Tensor> {
    Ok(if t.is_contiguous() {
        t.copy()?
    } else {
        t.contiguous()?
    })
}

static NEXT_PREFIX_ID: AtomicU64 = AtomicU64::new(1);

/// A frozen, shareable prefix of tokens with its keys and values for every layer.
#[derive(Debug)]
pub struct Prefix {
    id: u64,
    tokens: Vec<u32>,
    layers: Vec<LayerKv>,
}

impl Prefix {
    /// A process-unique id (two prefixes are the same cache iff their ids match).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Number of cached positions.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// True for a prefix of no tokens.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The tokens the prefix was computed from.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Keys and values of layer `i`.
    pub fn layer(&self, i: usize) -> Option<&LayerKv> {
        self.layers.get(i)
    }

    /// Bytes held by the prefix's keys and values.
    pub fn kv_bytes(&self) -> usize {
        self.layers.iter().map(LayerKv::bytes).sum()
    }

    /// The first `len` positions of this prefix as a prefix of their own (views of the same
    /// storage, nothing copied); `len` equal to the length returns this prefix.
    pub fn truncated(self: &Arc<Self>, len: usize) -> Result<Arc<Prefix>> {
        if len == self.len() {
            return Ok(Arc::clone(self));
        }
        if len == 0 || len > self.len() {
            return Err(Error::InvalidRequest(format!(
                "cannot cut a prefix of {} positions to {len}",
                self.len()
            )));
        }
        Ok(Arc::new(Prefix {
            id: NEXT_PREFIX_ID.fetch_add(1, Ordering::Relaxed),
            tokens: self.tokens[..len].to_vec(),
            layers: self
                .layers
                .iter()
                .map(|l| l.narrow(len))
                .collect::<Result<_>>()?,
        }))
    }

    /// Starts a new sequence on this prefix, with an empty suffix. O(1): nothing is copied.
    pub fn fork(self: &Arc<Self>) -> Sequence {
        Sequence {
            prefix: Some(Arc::clone(self)),
            tokens: Vec::new(),
            layers: vec![None; self.layers.len()],
        }
    }
}

/// One sequence: an optional shared prefix plus its own suffix.
#[derive(Debug, Clone)]
pub struct Sequence {
    prefix: Option<Arc<Prefix>>,
    tokens: Vec<u32>,
    layers: Vec<Option<Suffix>>,
}

impl Sequence {
    /// An empty sequence with no prefix, for a model of `num_layers` layers.
    pub fn new(num_layers: usize) -> Self {
        Self {
            prefix: None,
            tokens: Vec::new(),
            layers: vec![None; num_layers],
        }
    }

    /// The shared prefix, if any.
    pub fn prefix(&self) -> Option<&Arc<Prefix>> {
        self.prefix.as_ref()
    }

    /// Positions in the shared prefix.
    pub fn prefix_len(&self) -> usize {
        self.prefix.as_ref().map_or(0, |p| p.len())
    }

    /// Positions in this sequence's own suffix.
    pub fn suffix_len(&self) -> usize {
        self.tokens.len()
    }

    /// Total positions (prefix + suffix); the position of the next token.
    pub fn len(&self) -> usize {
        self.prefix_len() + self.suffix_len()
    }

    /// True when the sequence holds no positions at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The suffix tokens.
    pub fn suffix_tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// All tokens, prefix then suffix.
    pub fn tokens(&self) -> Vec<u32> {
        let mut out = self
            .prefix
            .as_ref()
            .map_or_else(Vec::new, |p| p.tokens.clone());
        out.extend_from_slice(&self.tokens);
        out
    }

    /// Number of layers this sequence caches.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Whether two sequences reference the very same prefix storage.
    pub fn shares_prefix_with(&self, other: &Sequence) -> bool {
        match (&self.prefix, &other.prefix) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// A second sequence with the same prefix and suffix. The prefix is shared by reference,
    /// the suffix buffers too: the first of the two to extend writes in place, the other
    /// copies its suffix when it extends.
    pub fn fork(&self) -> Sequence {
        self.clone()
    }

    /// Rolls the sequence back to `len` positions. The prefix cannot be rolled back.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        let plen = self.prefix_len();
        if len < plen {
            return Err(Error::InvalidRequest(format!(
                "cannot roll back to {len} positions: the shared prefix has {plen}"
            )));
        }
        let keep = len - plen;
        if keep >= self.tokens.len() {
            return Ok(());
        }
        self.tokens.truncate(keep);
        for layer in self.layers.iter_mut() {
            match layer {
                Some(s) if keep > 0 => s.truncate(keep)?,
                _ => *layer = None,
            }
        }
        Ok(())
    }

    /// Turns this sequence (prefix + suffix) into a new frozen prefix.
    pub fn freeze(self) -> Result<Arc<Prefix>> {
        if self.tokens.is_empty() {
            if let Some(p) = self.prefix {
                return Ok(p);
            }
        }
        let mut layers = Vec::with_capacity(self.layers.len());
        for (i, suffix) in self.layers.into_iter().enumerate() {
            let pre = self.prefix.as_ref().and_then(|p| p.layers.get(i));
            let kv = match (pre, suffix.map(|s| s.view)) {
                (Some(p), Some(s)) => LayerKv {
                    k: Tensor::cat(&[&p.k, &s.k], 1)?,
                    v: Tensor::cat(&[&p.v, &s.v], 1)?,
                },
                (Some(p), None) => p.clone(),
                (None, Some(s)) => LayerKv {
                    k: own_storage(&s.k)?,
                    v: own_storage(&s.v)?,
                },
                (None, None) => {
                    return Err(Error::InvalidRequest(
                        "cannot freeze an empty sequence into a prefix".into(),
                    ))
                }
            };
            layers.push(kv);
        }
        let mut tokens = self
            .prefix
            .as_ref()
            .map_or_else(Vec::new, |p| p.tokens.clone());
        tokens.extend_from_slice(&self.tokens);
        Ok(Arc::new(Prefix {
            id: NEXT_PREFIX_ID.fetch_add(1, Ordering::Relaxed),
            tokens,
            layers,
        }))
    }

    /// Bytes of the keys and values of this sequence's own suffix positions (the prefix is
    /// not counted; the buffers hold up to twice as many positions).
    pub fn suffix_kv_bytes(&self) -> usize {
        self.layers.iter().flatten().map(|s| s.view.bytes()).sum()
    }

    pub(crate) fn suffix_layer(&self, i: usize) -> Option<&LayerKv> {
        self.layers.get(i).and_then(|l| l.as_ref()).map(|s| &s.view)
    }

    /// Appends new keys/values (kv_heads, n, head_dim) to layer `i`'s suffix.
    pub(crate) fn append_layer(&mut self, i: usize, k: Tensor, v: Tensor) -> Result<()> {
        let slot = self
            .layers
            .get_mut(i)
            .ok_or_else(|| Error::InvalidRequest(format!("sequence has no layer {i}")))?;
        let (k, v) = (k.contiguous()?, v.contiguous()?);
        match slot {
            Some(s) => s.extend(&k, &v),
            None => {
                *slot = Some(Suffix::new(&k, &v)?);
                Ok(())
            }
        }
    }

    pub(crate) fn push_tokens(&mut self, tokens: &[u32]) {
        self.tokens.extend_from_slice(tokens);
    }

    pub(crate) fn check_consistent(&self) -> Result<()> {
        for kv in self.layers.iter().flatten().map(|s| &s.view) {
            if kv.len() != self.tokens.len() {
                return Err(Error::InvalidRequest(format!(
                    "sequence cache holds {} positions but {} suffix tokens",
                    kv.len(),
                    self.tokens.len()
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    fn kv(len: usize, fill: f32) -> (Tensor, Tensor) {
        let t = Tensor::full(fill, (2, len, 4), &Device::Cpu).unwrap();
        (t.clone(), t)
    }

    fn seq_with(len: usize) -> Sequence {
        let mut s = Sequence::new(2);
        for l in 0..2 {
            let (k, v) = kv(len, 1.0);
            s.append_layer(l, k, v).unwrap();
        }
        s.push_tokens(&vec![7; len]);
        s
    }

    #[test]
    fn fork_shares_prefix_storage() {
        let prefix = seq_with(5).freeze().unwrap();
        let a = prefix.fork();
        let b = prefix.fork();
        assert!(a.shares_prefix_with(&b));
        assert!(Arc::ptr_eq(a.prefix().unwrap(), &prefix));
        assert_eq!(Arc::strong_count(&prefix), 3);
        assert_eq!(a.suffix_kv_bytes(), 0);
        assert_eq!(a.len(), 5);
        assert_eq!(prefix.kv_bytes(), 2 * 2 * (2 * 5 * 4) * 4);
    }

    #[test]
    fn truncate_and_bounds() {
        let prefix = seq_with(3).freeze().unwrap();
        let mut s = prefix.fork();
        for l in 0..2 {
            let (k, v) = kv(4, 2.0);
            s.append_layer(l, k, v).unwrap();
        }
        s.push_tokens(&[1, 2, 3, 4]);
        s.truncate(5).unwrap();
        assert_eq!(s.len(), 5);
        assert_eq!(s.suffix_layer(0).unwrap().len(), 2);
        s.check_consistent().unwrap();
        assert!(s.truncate(2).is_err(), "cannot cut into the prefix");
        s.truncate(3).unwrap();
        assert_eq!(s.suffix_len(), 0);
        assert!(s.suffix_layer(1).is_none());
    }

    #[test]
    fn freeze_on_prefix_concatenates() {
        let prefix = seq_with(3).freeze().unwrap();
        let mut s = prefix.fork();
        for l in 0..2 {
            let (k, v) = kv(2, 2.0);
            s.append_layer(l, k, v).unwrap();
        }
        s.push_tokens(&[1, 2]);
        let p2 = s.freeze().unwrap();
        assert_eq!(p2.len(), 5);
        assert_ne!(p2.id(), prefix.id());
        assert_eq!(p2.tokens(), &[7, 7, 7, 1, 2]);
        let k = p2.layer(0).unwrap().k.to_vec3::<f32>().unwrap();
        assert_eq!(k[0][2][0], 1.0);
        assert_eq!(k[0][3][0], 2.0);
        assert!(Sequence::new(2).freeze().is_err());
    }

    #[test]
    fn truncated_prefix_keeps_the_first_positions() {
        let mut s = seq_with(3);
        for l in 0..2 {
            let (k, v) = kv(2, 2.0);
            s.append_layer(l, k, v).unwrap();
        }
        s.push_tokens(&[1, 2]);
        let p = s.freeze().unwrap();
        let t = p.truncated(4).unwrap();
        assert_eq!(t.tokens(), &[7, 7, 7, 1]);
        assert_ne!(t.id(), p.id());
        assert_eq!(t.layer(1).unwrap().k.dims(), &[2, 4, 4]);
        assert_eq!(
            t.layer(0).unwrap().v.to_vec3::<f32>().unwrap()[1][3][0],
            2.0
        );
        assert!(Arc::ptr_eq(&p.truncated(5).unwrap(), &p));
        assert!(p.truncated(0).is_err() && p.truncated(6).is_err());
    }

    fn same_storage(a: &Tensor, b: &Tensor) -> bool {
        let ptr = |t: &Tensor| match &*t.storage_and_layout().0 {
            candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)) => v.as_ptr(),
            _ => std::ptr::null(),
        };
        ptr(a) == ptr(b)
    }

    fn first(s: &Sequence, layer: usize) -> Vec<f32> {
        let kv = s.suffix_layer(layer).unwrap();
        let k = kv.k.to_vec3::<f32>().unwrap();
        k[1].iter().map(|p| p[0]).collect()
    }

    fn extend(s: &mut Sequence, fill: f32) {
        for l in 0..2 {
            let (k, v) = kv(1, fill);
            s.append_layer(l, k, v).unwrap();
        }
        s.push_tokens(&[fill as u32]);
    }

    #[test]
    fn extending_writes_in_place_until_a_fork_has_written_there() {
        let mut a = seq_with(2);
        extend(&mut a, 3.0);
        let buffer = a.layers[0].as_ref().unwrap().k.clone();
        extend(&mut a, 4.0);
        assert!(
            same_storage(&a.suffix_layer(0).unwrap().k, &buffer),
            "in place"
        );
        let mut b = a.fork();
        extend(&mut a, 5.0);
        assert!(same_storage(&a.suffix_layer(0).unwrap().k, &buffer));
        // b shares the buffer but a wrote past b's positions: b copies.
        extend(&mut b, 6.0);
        assert!(!same_storage(&b.suffix_layer(0).unwrap().k, &buffer));
        assert_eq!(first(&a, 0), [1.0, 1.0, 3.0, 4.0, 5.0]);
        assert_eq!(first(&b, 1), [1.0, 1.0, 3.0, 4.0, 6.0]);
        a.check_consistent().unwrap();
        b.check_consistent().unwrap();
    }

    #[test]
    fn a_rolled_back_sequence_reuses_its_buffer_only_when_unshared() {
        let mut a = seq_with(3);
        extend(&mut a, 3.0);
        let buffer = a.layers[0].as_ref().unwrap().k.clone();
        let b = a.fork();
        a.truncate(2).unwrap();
        extend(&mut a, 8.0);
        assert!(
            !same_storage(&a.suffix_layer(0).unwrap().k, &buffer),
            "b still reads it"
        );
        assert_eq!(first(&b, 0), [1.0, 1.0, 1.0, 3.0]);
        drop(b);
        let mut c = seq_with(3);
        extend(&mut c, 3.0);
        let buffer = c.layers[0].as_ref().unwrap().k.clone();
        c.truncate(2).unwrap();
        extend(&mut c, 9.0);
        assert!(
            same_storage(&c.suffix_layer(0).unwrap().k, &buffer),
            "reused"
        );
        assert_eq!(first(&c, 1), [1.0, 1.0, 9.0]);
    }

    #[test]
    fn a_frozen_prefix_keeps_its_values_while_forks_write_on() {
        let mut a = seq_with(MIN_CAPACITY);
        let mut b = a.fork();
        let buffer = b.layers[0].as_ref().unwrap().k.clone();
        let prefix = std::mem::replace(&mut a, Sequence::new(2))
            .freeze()
            .unwrap();
        // b is the buffer's only sequence now: it rolls back and writes in place.
        b.truncate(1).unwrap();
        extend(&mut b, 7.0);
        assert!(same_storage(&b.suffix_layer(0).unwrap().k, &buffer));
        let k = prefix.layer(0).unwrap().k.to_vec3::<f32>().unwrap();
        assert!(k[0].iter().all(|p| p[0] == 1.0));
        assert_eq!(first(&b, 0), [1.0, 7.0]);
    }
}
