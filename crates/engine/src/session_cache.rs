//! Prefilled prefixes kept across compactions: one entry per (session, role), bounded in
//! bytes, least recently used out first. A re-compaction of a grown session takes its entry
//! as the base of the next prefill, so only the positions after their common tokens are
//! computed again; `forget` drops every entry of a session (deleted text never stays cached).

use std::collections::HashMap;

/// Which prefix of a compaction an entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// The target's shared prefix (the whole history).
    Target,
    /// The drafter's shared prefix (the whole history).
    Drafter,
    /// The drafter's view for one slot.
    DrafterView(usize),
}

#[derive(Debug)]
struct Entry<V> {
    value: V,
    bytes: usize,
    used: u64,
}

/// A byte-bounded LRU map from (session, role) to a cached value.
#[derive(Debug)]
pub struct SessionCache<V> {
    entries: HashMap<(String, Role), Entry<V>>,
    bound: usize,
    total: usize,
    clock: u64,
}

impl<V: Clone> SessionCache<V> {
    /// An empty cache holding at most `bound` bytes (0: nothing is kept).
    pub fn new(bound: usize) -> Self {
        Self {
            entries: HashMap::new(),
            bound,
            total: 0,
            clock: 0,
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The entry of `(session, role)`, marked as most recently used.
    pub fn get(&mut self, session: &str, role: Role) -> Option<V> {
        let t = self.tick();
        let e = self.entries.get_mut(&(session.to_string(), role))?;
        e.used = t;
        Some(e.value.clone())
    }

    /// Stores `value` (replacing the entry of the same key), then evicts least recently used
    /// entries until the bound holds. A value larger than the bound is not kept. Returns the
    /// keys evicted to make room.
    pub fn insert(
        &mut self,
        session: &str,
        role: Role,
        value: V,
        bytes: usize,
    ) -> Vec<(String, Role)> {
        let key = (session.to_string(), role);
        if let Some(old) = self.entries.remove(&key) {
            self.total -= old.bytes;
        }
        if bytes > self.bound {
            return Vec::new();
        }
        let used = self.tick();
        self.entries
            .insert(key.clone(), Entry { value, bytes, used });
        self.total += bytes;
        let mut evicted = Vec::new();
        while self.total > self.bound {
            let Some(oldest) = self
                .entries
                .iter()
                .filter(|(k, _)| **k != key)
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(e) = self.entries.remove(&oldest) {
                self.total -= e.bytes;
            }
            evicted.push(oldest);
        }
        evicted
    }

    /// Drops every entry of `session`; returns how many there were.
    pub fn forget(&mut self, session: &str) -> usize {
        let keys: Vec<(String, Role)> = self
            .entries
            .keys()
            .filter(|(s, _)| s == session)
            .cloned()
            .collect();
        for k in &keys {
            if let Some(e) = self.entries.remove(k) {
                self.total -= e.bytes;
            }
        }
        keys.len()
    }

    /// Drops every entry; returns how many there were.
    pub fn clear(&mut self) -> usize {
        let n = self.entries.len();
        self.entries.clear();
        self.total = 0;
        n
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.total
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether `(session, role)` is cached (without touching its recency).
    pub fn contains(&self, session: &str, role: Role) -> bool {
        self.entries.contains_key(&(session.to_string(), role))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The naive model: a list in recency order (least recent first).
    #[derive(Default)]
    struct Naive {
        order: Vec<((String, Role), u32, usize)>,
    }

    impl Naive {
        fn get(&mut self, k: &(String, Role)) -> Option<u32> {
            let i = self.order.iter().position(|(key, _, _)| key == k)?;
            let e = self.order.remove(i);
            let v = e.1;
            self.order.push(e);
            Some(v)
        }
        fn insert(&mut self, k: (String, Role), v: u32, bytes: usize, bound: usize) {
            self.order.retain(|(key, _, _)| *key != k);
            if bytes > bound {
                return;
            }
            self.order.push((k, v, bytes));
            while self.order.iter().map(|e| e.2).sum::<usize>() > bound {
                self.order.remove(0);
            }
        }
        fn forget(&mut self, s: &str) -> usize {
            let before = self.order.len();
            self.order.retain(|((session, _), _, _)| session != s);
            before - self.order.len()
        }
    }

    /// A small deterministic generator (xorshift).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    #[test]
    fn random_operations_match_the_naive_model() {
        let roles = [
            Role::Target,
            Role::Drafter,
            Role::DrafterView(0),
            Role::DrafterView(3),
        ];
        for seed in 1..40u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let bound = 50 + rng.next(200) as usize;
            let mut cache: SessionCache<u32> = SessionCache::new(bound);
            let mut naive = Naive::default();
            for step in 0..400u32 {
                let session = format!("s{}", rng.next(5));
                let role = roles[rng.next(roles.len() as u64) as usize];
                let key = (session.clone(), role);
                match rng.next(10) {
                    // Insert a new or grown value (a re-compaction).
                    0..=4 => {
                        let bytes = 1 + rng.next(bound as u64 / 2 + 20) as usize;
                        cache.insert(&session, role, step, bytes);
                        naive.insert(key, step, bytes, bound);
                    }
                    5..=7 => assert_eq!(cache.get(&session, role), naive.get(&key)),
                    8 => assert_eq!(cache.forget(&session), naive.forget(&session)),
                    _ => {
                        // A value over the bound is never kept and evicts nothing else.
                        let before = cache.len();
                        let had = cache.contains(&session, role);
                        cache.insert(&session, role, step, bound + 1);
                        naive.insert(key.clone(), step, bound + 1, bound);
                        assert!(!cache.contains(&session, role));
                        assert_eq!(cache.len(), before - usize::from(had));
                    }
                }
                // Invariants: the byte count is exact and within the bound, the same keys
                // are held as by the naive model, with the same values.
                let sum: usize = naive.order.iter().map(|e| e.2).sum();
                assert_eq!(cache.bytes(), sum, "seed {seed} step {step}");
                assert!(cache.bytes() <= bound);
                assert_eq!(cache.len(), naive.order.len());
                for ((s, r), v, _) in &naive.order {
                    assert_eq!(
                        cache.entries.get(&(s.clone(), *r)).map(|e| e.value),
                        Some(*v)
                    );
                }
            }
        }
    }

    #[test]
    fn least_recently_used_goes_first_and_forget_reaches_every_role() {
        let mut c: SessionCache<&str> = SessionCache::new(10);
        c.insert("a", Role::Target, "a-t", 4);
        c.insert("b", Role::Target, "b-t", 4);
        assert_eq!(c.get("a", Role::Target), Some("a-t"));
        let evicted = c.insert("c", Role::Drafter, "c-d", 4);
        assert_eq!(evicted, vec![("b".to_string(), Role::Target)]);
        assert!(c.contains("a", Role::Target) && c.contains("c", Role::Drafter));
        c.insert("a", Role::DrafterView(2), "a-v", 2);
        assert_eq!(c.forget("a"), 2);
        assert_eq!(c.bytes(), 4);
        assert_eq!(c.forget("a"), 0);
        let mut none: SessionCache<u8> = SessionCache::new(0);
        none.insert("x", Role::Target, 1, 1);
        assert!(none.is_empty());
    }
}
