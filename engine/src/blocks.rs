//! The KV block allocator: reference counts, the prefix cache index, and LRU
//! eviction. Pure bookkeeping: it never touches tensors.
//!
//! A block is in exactly one of three states:
//! - used: referenced by at least one sequence (refcount > 0);
//! - cached: free, but holding a full block of tokens whose hash is indexed,
//!   so a later request with the same prefix can take it back (LRU ordered);
//! - free: holding nothing reusable.
//!
//! Allocation takes a free block first, and otherwise evicts the least
//! recently used cached block.

use std::collections::{BTreeMap, HashMap, VecDeque};

pub type BlockId = u32;

/// Hash of a full block: chained over the previous block's hash, the
/// block's token ids and the request's cache salt, so equal hashes mean
/// equal prefixes.
pub fn block_hash(prev: Option<u64>, tokens: &[u32], salt: &str) -> u64 {
    // FNV-1a, 64-bit: stable across runs and platforms.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |b: u8| {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    };
    for b in prev.unwrap_or(0).to_le_bytes() {
        eat(b);
    }
    eat(prev.is_some() as u8);
    for b in (salt.len() as u64)
        .to_le_bytes()
        .into_iter()
        .chain(salt.bytes())
    {
        eat(b);
    }
    for t in tokens {
        for b in t.to_le_bytes() {
            eat(b);
        }
    }
    h
}

pub struct BlockAllocator {
    refcount: Vec<u32>,
    hash_of: Vec<Option<u64>>,
    by_hash: HashMap<u64, BlockId>,
    free: VecDeque<BlockId>,
    /// Cached blocks with refcount 0, by last use.
    lru: BTreeMap<u64, BlockId>,
    lru_tick_of: Vec<Option<u64>>,
    tick: u64,
}

impl BlockAllocator {
    pub fn new(num_blocks: u32) -> Self {
        let n = num_blocks as usize;
        Self {
            refcount: vec![0; n],
            hash_of: vec![None; n],
            by_hash: HashMap::new(),
            free: (0..num_blocks).collect(),
            lru: BTreeMap::new(),
            lru_tick_of: vec![None; n],
            tick: 0,
        }
    }

    pub fn total(&self) -> u32 {
        self.refcount.len() as u32
    }

    /// Blocks an allocation can get (free + evictable cached).
    pub fn available(&self) -> u32 {
        (self.free.len() + self.lru.len()) as u32
    }

    /// Blocks referenced by a sequence.
    pub fn used(&self) -> u32 {
        self.total() - self.available()
    }

    /// Free blocks still holding a reusable prefix.
    pub fn cached(&self) -> u32 {
        self.lru.len() as u32
    }

    pub fn refcount(&self, b: BlockId) -> u32 {
        self.refcount[b as usize]
    }

    /// A block for new tokens (refcount 1), or None when every block is used.
    pub fn allocate(&mut self) -> Option<BlockId> {
        let b = match self.free.pop_front() {
            Some(b) => b,
            None => {
                let (&tick, &b) = self.lru.iter().next()?;
                self.lru.remove(&tick);
                self.lru_tick_of[b as usize] = None;
                if let Some(h) = self.hash_of[b as usize].take() {
                    self.by_hash.remove(&h);
                }
                b
            }
        };
        self.refcount[b as usize] = 1;
        Some(b)
    }

    /// One more reference to a block (a shared prefix or a fork).
    pub fn retain(&mut self, b: BlockId) {
        let i = b as usize;
        if self.refcount[i] == 0
            && let Some(t) = self.lru_tick_of[i].take()
        {
            self.lru.remove(&t);
        }
        self.refcount[i] += 1;
    }

    /// Drops a reference; an unreferenced block becomes cached (if it holds
    /// an indexed prefix) or free.
    pub fn release(&mut self, b: BlockId) {
        let i = b as usize;
        debug_assert!(self.refcount[i] > 0, "release of a free block");
        self.refcount[i] = self.refcount[i].saturating_sub(1);
        if self.refcount[i] > 0 {
            return;
        }
        if self.hash_of[i].is_some() {
            self.tick += 1;
            self.lru.insert(self.tick, b);
            self.lru_tick_of[i] = Some(self.tick);
        } else {
            self.free.push_back(b);
        }
    }

    /// The cached block holding this prefix hash, retained for the caller.
    pub fn lookup(&mut self, hash: u64) -> Option<BlockId> {
        let b = *self.by_hash.get(&hash)?;
        self.retain(b);
        Some(b)
    }

    /// Indexes a block that just became full under `hash`. When another
    /// block already holds that prefix, the index keeps the older one.
    pub fn register(&mut self, b: BlockId, hash: u64) {
        if self.hash_of[b as usize].is_some() || self.by_hash.contains_key(&hash) {
            return;
        }
        self.by_hash.insert(hash, b);
        self.hash_of[b as usize] = Some(hash);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_until_exhausted_then_release() {
        let mut a = BlockAllocator::new(3);
        let bs: Vec<_> = (0..3).map(|_| a.allocate().expect("block")).collect();
        assert_eq!(a.allocate(), None);
        assert_eq!(a.used(), 3);
        for b in bs {
            a.release(b);
        }
        assert_eq!((a.used(), a.available(), a.cached()), (0, 3, 0));
    }

    #[test]
    fn released_full_blocks_stay_findable_until_evicted_lru_first() {
        let mut a = BlockAllocator::new(2);
        let x = a.allocate().expect("x");
        let y = a.allocate().expect("y");
        a.register(x, 11);
        a.register(y, 22);
        a.release(x); // older
        a.release(y);
        assert_eq!((a.used(), a.cached()), (0, 2));
        // Taking y back removes it from the LRU; the next allocation evicts x.
        assert_eq!(a.lookup(22), Some(y));
        assert_eq!(a.refcount(y), 1);
        let z = a.allocate().expect("evicts x");
        assert_eq!(z, x);
        assert_eq!(a.lookup(11), None, "evicted prefix must be forgotten");
        assert_eq!(a.lookup(22), Some(y));
        assert_eq!(a.refcount(y), 2);
    }

    #[test]
    fn shared_blocks_free_only_at_last_release() {
        let mut a = BlockAllocator::new(1);
        let b = a.allocate().expect("b");
        a.retain(b);
        a.release(b);
        assert_eq!(a.allocate(), None, "still referenced once");
        a.release(b);
        assert_eq!(a.allocate(), Some(b));
    }

    #[test]
    fn hash_chain_depends_on_prefix_and_salt() {
        let h1 = block_hash(None, &[1, 2, 3], "");
        assert_eq!(h1, block_hash(None, &[1, 2, 3], ""));
        assert_ne!(h1, block_hash(None, &[1, 2, 4], ""));
        assert_ne!(h1, block_hash(None, &[1, 2, 3], "tenant-a"));
        assert_ne!(
            block_hash(Some(h1), &[5], ""),
            block_hash(Some(h1 ^ 1), &[5], "")
        );
        assert_ne!(block_hash(None, &[5], ""), block_hash(Some(0), &[5], ""));
    }

    #[test]
    fn duplicate_prefix_keeps_the_indexed_block() {
        let mut a = BlockAllocator::new(2);
        let x = a.allocate().expect("x");
        let y = a.allocate().expect("y");
        a.register(x, 7);
        a.register(y, 7);
        a.release(y);
        // y held no indexed prefix: it is plainly free, not cached.
        assert_eq!((a.cached(), a.available()), (0, 1));
        assert_eq!(a.lookup(7), Some(x));
    }
}
