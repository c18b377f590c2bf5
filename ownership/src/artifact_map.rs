//! The directory's prefix artifacts ([`Artifact`], their copies' [`Location`]s) by key,
//! with what a lookup needs to find a prompt's owned prefix without probing every block
//! of it.
//!
//! An artifact is keyed by the chain hash of its last block (`blocks.1`), so a prompt's
//! owned prefix can only end at a block count some artifact ends at (`ends`). And each
//! artifact carries its chain's hashes at the checkpoint counts 1, 2, 3, 4, 6, 8, 12, …
//! (`command::checkpoint_blocks`): a prompt whose hash at count `p` is nobody's checkpoint
//! shares fewer than `p` blocks with every artifact's chain, and then fewer than every
//! later count too (chained hashes: sharing `p` blocks means sharing all before). So a
//! lookup first walks the checkpoints up the prompt (≤ 2 log₂ n probes) to bound the
//! shared length, then probes only the ends below that bound: a brand-new prompt costs a
//! probe or two, a new session sharing a system prompt of `s` blocks probes the ends
//! below 1.5 `s`. Artifacts written without checkpoints are kept apart and probed at
//! every end the prompt can hold. The index is derived from the artifacts alone, so it
//! is not part of a snapshot: deserialising rebuilds it, and two maps with the same
//! artifacts are equal.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{BuildHasher, Hasher};
use std::iter::Peekable;
use std::ops::Deref;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::command::checkpoint_blocks;
use crate::ids::{Epoch, Owner, PrefixKey, Tier, WorkerId};

/// A copy of an artifact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Location {
    pub worker: WorkerId,
    pub tier: Tier,
}

/// A sealed prefix artifact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Artifact {
    pub parent: Option<PrefixKey>,
    pub blocks: (u32, u32),
    pub kv_type: String,
    pub size_bytes: u64,
    pub owner: Option<Owner>,
    /// Epoch of the last owner change, kept when the owner goes so epochs keep increasing.
    pub epoch: Epoch,
    pub locations: BTreeSet<Location>,
    /// Live sessions built on this artifact (forks share it).
    pub ref_count: u32,
    /// Its owner died with no copy elsewhere: the next user recomputes it.
    pub needs_recompute: bool,
    pub last_access_ms: u64,
    /// The chain's hashes at `checkpoint_blocks(blocks.1)` (empty when the writer sent
    /// none, or not one per count).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checkpoints: Vec<u64>,
}

/// Artifacts by key (read through `Deref` as the ordered map), the block counts they end
/// at, and their chains' checkpoint hashes. Inserting goes through [`ArtifactMap::insert`]
/// so the index stays true; an artifact's `blocks` and `checkpoints` never change after
/// it is created.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArtifactMap {
    by_key: BTreeMap<PrefixKey, Artifact>,
    /// How many checkpointed artifacts end at each block count.
    ends: BTreeMap<u32, u32>,
    /// How many artifacts without checkpoints end at each block count.
    unchecked_ends: BTreeMap<u32, u32>,
    /// `(block count, chain hash there)` → how many artifacts' chains pass through it.
    checkpoints: HashMap<(u32, u64), u32, ChainHashing>,
    /// Every key, for probes that mostly miss: a hash probe is a few nanoseconds, an
    /// ordered-map probe of a large directory ten times that.
    keys: HashSet<PrefixKey, ChainHashing>,
}

impl ArtifactMap {
    /// Adds or replaces `key`'s artifact; the replaced one, if any.
    pub fn insert(&mut self, key: PrefixKey, artifact: Artifact) -> Option<Artifact> {
        self.index(&artifact, true);
        self.keys.insert(key);
        let old = self.by_key.insert(key, artifact)?;
        self.index(&old, false);
        Some(old)
    }

    /// Removes `key`'s artifact, dropping it from the index; the artifact, if there was one.
    pub fn remove(&mut self, key: &PrefixKey) -> Option<Artifact> {
        let old = self.by_key.remove(key)?;
        self.keys.remove(key);
        self.index(&old, false);
        Some(old)
    }

    /// `key`'s artifact, to change its owner, locations, counts or access time (never its
    /// `blocks` or `checkpoints`, which the index was built from).
    pub fn get_mut(&mut self, key: &PrefixKey) -> Option<&mut Artifact> {
        self.by_key.get_mut(key)
    }

    /// Every artifact, to change what [`ArtifactMap::get_mut`] may change.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut Artifact> {
        self.by_key.values_mut()
    }

    /// The block counts, longest first, at which an artifact ends that is a prefix of the
    /// prompt whose chain hashes are `hashes` (its key is `hashes[end - 1]`).
    pub fn prefix_ends<'a>(&'a self, hashes: &'a [u64]) -> impl Iterator<Item = u32> + 'a {
        self.candidate_ends(hashes)
            .filter(move |&end| self.keys.contains(&PrefixKey(hashes[end as usize - 1])))
    }

    /// The block counts a prompt's owned prefix may end at, longest first, each to be probed
    /// in `keys`: every artifact end below the bound its checkpoints leave, and every end of
    /// an artifact written without checkpoints.
    fn candidate_ends(&self, hashes: &[u64]) -> impl Iterator<Item = u32> + '_ {
        let n = u32::try_from(hashes.len()).unwrap_or(u32::MAX);
        let (bound, _) = self.shared_bound(hashes);
        Longest {
            a: descending(&self.ends, bound).peekable(),
            b: descending(&self.unchecked_ends, n).peekable(),
        }
    }

    /// The longest block count a checkpointed chain can share with the prompt (below the
    /// first checkpoint count whose hash no chain has), and the checkpoints probed to find
    /// it.
    fn shared_bound(&self, hashes: &[u64]) -> (u32, usize) {
        let n = u32::try_from(hashes.len()).unwrap_or(u32::MAX);
        let (mut shared, mut probed) = (0, 0);
        for p in checkpoint_blocks(n) {
            probed += 1;
            if !self.checkpoints.contains_key(&(p, hashes[p as usize - 1])) {
                break;
            }
            shared = p;
        }
        let bound = checkpoint_blocks(n)
            .find(|&p| p > shared)
            .map_or(n, |next| next - 1);
        (bound, probed)
    }

    fn index(&mut self, artifact: &Artifact, add: bool) {
        let end = artifact.blocks.1;
        let ends = if artifact.checkpoints.is_empty() {
            &mut self.unchecked_ends
        } else {
            &mut self.ends
        };
        ends.bump(end, add);
        let points = checkpoint_blocks(end).zip(artifact.checkpoints.iter().copied());
        for point in points {
            self.checkpoints.bump(point, add);
        }
    }
}

/// The index's counts (ordered for the ends, hashed for the checkpoints, which are only
/// probed): one more for `key`, or one less, dropping a count that reaches zero.
trait CountMap<K> {
    fn bump(&mut self, key: K, add: bool);
}

impl<K: Ord> CountMap<K> for BTreeMap<K, u32> {
    fn bump(&mut self, key: K, add: bool) {
        if add {
            *self.entry(key).or_default() += 1;
        } else if let std::collections::btree_map::Entry::Occupied(mut e) = self.entry(key) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }
}

impl<K: Eq + std::hash::Hash, S: BuildHasher> CountMap<K> for HashMap<K, u32, S> {
    fn bump(&mut self, key: K, add: bool) {
        if add {
            *self.entry(key).or_default() += 1;
        } else if let std::collections::hash_map::Entry::Occupied(mut e) = self.entry(key) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }
}

/// Hashing for keys that are chain hashes already (uniform 64-bit xxh3 values): one folded
/// multiply, keyed by a per-process random seed so that prompts crafted to collide in some
/// bits cannot aim at one bucket. Which bucket a key lands in never shows in behaviour
/// (these sets are only probed, never iterated), so the directory stays deterministic.
#[derive(Debug, Clone, Copy)]
pub struct ChainHashing(u64);

impl Default for ChainHashing {
    fn default() -> Self {
        Self(RandomState::new().hash_one(0x6f77_6e65_7273_6572_u64))
    }
}

impl BuildHasher for ChainHashing {
    type Hasher = ChainHasher;

    fn build_hasher(&self) -> ChainHasher {
        ChainHasher(self.0)
    }
}

/// See [`ChainHashing`].
#[derive(Debug, Clone, Copy)]
pub struct ChainHasher(u64);

impl Hasher for ChainHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        let full = u128::from(self.0 ^ n) * 0x9e37_79b9_7f4a_7c15_u128;
        self.0 = (full as u64) ^ ((full >> 64) as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The counts of `ends` from `max` down to 1.
fn descending(ends: &BTreeMap<u32, u32>, max: u32) -> impl Iterator<Item = u32> + '_ {
    ends.range(..=max)
        .rev()
        .map(|(&end, _)| end)
        .take_while(|&end| end > 0)
}

/// Two descending sequences merged, longest first (a count in both comes twice; probing
/// it twice is harmless).
struct Longest<A: Iterator<Item = u32>, B: Iterator<Item = u32>> {
    a: Peekable<A>,
    b: Peekable<B>,
}

impl<A: Iterator<Item = u32>, B: Iterator<Item = u32>> Iterator for Longest<A, B> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        match (self.a.peek(), self.b.peek()) {
            (Some(x), Some(y)) if x >= y => self.a.next(),
            (Some(_), None) => self.a.next(),
            _ => self.b.next(),
        }
    }
}

impl Deref for ArtifactMap {
    type Target = BTreeMap<PrefixKey, Artifact>;

    fn deref(&self) -> &Self::Target {
        &self.by_key
    }
}

impl<'a> IntoIterator for &'a ArtifactMap {
    type Item = (&'a PrefixKey, &'a Artifact);
    type IntoIter = std::collections::btree_map::Iter<'a, PrefixKey, Artifact>;

    fn into_iter(self) -> Self::IntoIter {
        self.by_key.iter()
    }
}

impl FromIterator<(PrefixKey, Artifact)> for ArtifactMap {
    fn from_iter<I: IntoIterator<Item = (PrefixKey, Artifact)>>(iter: I) -> Self {
        let mut map = Self::default();
        for (key, artifact) in iter {
            map.insert(key, artifact);
        }
        map
    }
}

/// Serialised as the plain map, as snapshots always were.
impl Serialize for ArtifactMap {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.by_key.serialize(s)
    }
}

impl<'de> Deserialize<'de> for ArtifactMap {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(BTreeMap::<PrefixKey, Artifact>::deserialize(d)?
            .into_iter()
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Epoch;

    /// An artifact ending at `end` on chain `c` (hash of block `i` = `c << 32 | i + 1`),
    /// with its checkpoints or without.
    fn artifact(c: u64, end: u32, checkpointed: bool) -> Artifact {
        Artifact {
            parent: None,
            blocks: (0, end),
            kv_type: "kv".into(),
            size_bytes: 0,
            owner: None,
            epoch: Epoch(0),
            locations: Default::default(),
            ref_count: 0,
            needs_recompute: false,
            last_access_ms: 0,
            checkpoints: if checkpointed {
                checkpoint_blocks(end)
                    .map(|p| chain(c, p)[p as usize - 1])
                    .collect()
            } else {
                Vec::new()
            },
        }
    }

    fn chain(c: u64, n: u32) -> Vec<u64> {
        (0..u64::from(n)).map(|i| (c << 32) | (i + 1)).collect()
    }

    #[test]
    fn checkpoint_counts_are_powers_of_two_and_one_and_a_half_times_them() {
        assert_eq!(
            checkpoint_blocks(50).collect::<Vec<_>>(),
            vec![1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48]
        );
        assert_eq!(checkpoint_blocks(0).count(), 0);
        assert_eq!(checkpoint_blocks(u32::MAX).last(), Some(3 << 30));
    }

    #[test]
    fn a_prompt_sharing_nothing_finds_nothing_and_one_sharing_a_prefix_finds_the_ends_below_its_bound(
    ) {
        let mut m = ArtifactMap::default();
        // Chain 1: artifacts at 4, 40 and 100 blocks. Chain 2 shares nothing with chain 1.
        for end in [4, 40, 100] {
            m.insert(
                PrefixKey(chain(1, end)[end as usize - 1]),
                artifact(1, end, true),
            );
        }
        assert_eq!(m.prefix_ends(&chain(2, 200)).count(), 0);
        // A prompt following chain 1 for 10 blocks, then its own: the bound is below
        // the checkpoint after 8 (12), so only the end at 4 is probed, and found.
        let mut forked = chain(1, 10);
        forked.extend(chain(3, 190).into_iter().skip(10));
        assert_eq!(m.prefix_ends(&forked).collect::<Vec<_>>(), vec![4]);
        // The whole chain: every end it can hold.
        assert_eq!(
            m.prefix_ends(&chain(1, 100)).collect::<Vec<_>>(),
            vec![100, 40, 4]
        );
        // An artifact without checkpoints is found though no checkpoint leads to it.
        m.insert(PrefixKey(chain(5, 7)[6]), artifact(5, 7, false));
        assert_eq!(m.prefix_ends(&chain(5, 200)).collect::<Vec<_>>(), vec![7]);
        assert_eq!(
            m.prefix_ends(&chain(1, 100)).collect::<Vec<_>>(),
            vec![100, 40, 4]
        );
        // An empty prompt holds nothing.
        assert_eq!(m.prefix_ends(&[]).count(), 0);
    }

    /// Hash-set probes a lookup of `hashes` makes: the checkpoints walked to bound the
    /// shared prefix, then one per candidate end below it.
    fn probes(m: &ArtifactMap, hashes: &[u64]) -> usize {
        m.shared_bound(hashes).1 + m.candidate_ends(hashes).count()
    }

    /// A router looks every step up in its replica. Timing a lookup against the directory's
    /// size is noisy (caches); its probes are exact. In a live-like directory (each of a
    /// session's steps claimed its whole prompt: a shared 64-block system prompt, then its
    /// own blocks, so artifacts end at nearly every length up to 2,048 blocks), what a
    /// lookup probes is bounded by the prompt, and stops changing once every length is
    /// someone's end: 10× the sessions, the same probes. (The sessions' own map is ordered:
    /// its probe is logarithmic by construction.)
    #[test]
    fn a_lookups_probes_do_not_grow_with_the_sessions_in_the_directory() {
        const SYSTEM: u32 = 64;
        const LONGEST: u32 = 2_048;
        const STEPS: u32 = 4;
        // Block `i`'s chain hash in session `s`'s prompt.
        let hash = |s: u64, i: u32| {
            if i < SYSTEM {
                (1 << 48) | u64::from(i + 1)
            } else {
                ((s + 2) << 32) | u64::from(i + 1)
            }
        };
        let prompt = |s: u64| -> Vec<u64> { (0..LONGEST).map(|i| hash(s, i)).collect() };
        let mut seen = Vec::new();
        for sessions in [100u64, 1_000, 10_000] {
            let mut m = ArtifactMap::default();
            let claims = sessions * u64::from(STEPS);
            for s in 0..sessions {
                for k in 0..u64::from(STEPS) {
                    let spread = (s * u64::from(STEPS) + k) * u64::from(LONGEST - SYSTEM - 1);
                    let end = SYSTEM + 1 + (spread / claims) as u32;
                    let mut a = artifact(0, end, false);
                    a.checkpoints = checkpoint_blocks(end).map(|p| hash(s, p - 1)).collect();
                    m.insert(PrefixKey(hash(s, end - 1)), a);
                }
            }
            let fresh: Vec<u64> = prompt(sessions).iter().map(|h| h ^ 0x5555).collect();
            seen.push([
                probes(&m, &fresh),
                probes(&m, &prompt(sessions)),
                probes(&m, &prompt(sessions - 1)),
            ]);
        }
        // A brand-new prompt: one checkpoint missed, no end below it.
        assert!(seen.iter().all(|p| p[0] <= 2), "{seen:?}");
        // A new session sharing the system prompt: the checkpoints up to it (2 log₂ 64),
        // then the ends below 1.5 × 64.
        assert!(seen.iter().all(|p| p[1] <= 13 + 96), "{seen:?}");
        // A session's next step: at most every length of its prompt.
        assert!(
            seen.iter().all(|p| p[2] <= 22 + LONGEST as usize),
            "{seen:?}"
        );
        assert_eq!(seen[1], seen[2], "1,000 and 10,000 sessions: {seen:?}");
        // And what the probes find is the session's own longest claim.
        let mut m = ArtifactMap::default();
        let end = 300;
        let mut a = artifact(0, end, false);
        a.checkpoints = checkpoint_blocks(end).map(|p| hash(7, p - 1)).collect();
        m.insert(PrefixKey(hash(7, end - 1)), a);
        assert_eq!(m.prefix_ends(&prompt(7)).collect::<Vec<_>>(), vec![end]);
    }

    #[test]
    fn replacing_an_artifact_moves_its_index_entries() {
        let mut m = ArtifactMap::default();
        let key = PrefixKey(chain(1, 9)[8]);
        m.insert(key, artifact(1, 9, true));
        m.insert(key, artifact(1, 9, false));
        let fresh: ArtifactMap = [(key, artifact(1, 9, false))].into_iter().collect();
        assert_eq!(m, fresh);
        assert!(m.checkpoints.is_empty());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 200, failure_persistence: None, ..Default::default() })]

        /// Any sequence of inserts, replacements and removes leaves the index what
        /// rebuilding it from the artifacts alone gives, and a lookup finds exactly the
        /// ends of the artifacts still there.
        #[test]
        fn inserts_and_removes_keep_the_index_true(
            ops in proptest::collection::vec((0u64..4, 1u32..40, proptest::prelude::any::<bool>(), proptest::prelude::any::<bool>()), 1..60)
        ) {
            let mut m = ArtifactMap::default();
            for (c, end, checkpointed, remove) in ops {
                let key = PrefixKey(chain(c, end)[end as usize - 1]);
                if remove {
                    let had = m.contains_key(&key);
                    proptest::prop_assert_eq!(m.remove(&key).is_some(), had);
                } else {
                    m.insert(key, artifact(c, end, checkpointed));
                }
                let rebuilt: ArtifactMap = m.by_key.clone().into_iter().collect();
                proptest::prop_assert_eq!(&m, &rebuilt);
                proptest::prop_assert_eq!(m.keys.len(), m.by_key.len());
                for c in 0..4 {
                    let found: Vec<u32> = m.prefix_ends(&chain(c, 40)).collect();
                    let mut held: Vec<u32> = m
                        .iter()
                        .filter(|(k, a)| **k == PrefixKey(chain(c, a.blocks.1)[a.blocks.1 as usize - 1]))
                        .map(|(_, a)| a.blocks.1)
                        .collect();
                    held.sort_unstable_by(|a, b| b.cmp(a));
                    let mut found_sorted = found.clone();
                    found_sorted.dedup();
                    proptest::prop_assert_eq!(found_sorted, held);
                }
            }
            // Removing everything leaves an empty index.
            let keys: Vec<PrefixKey> = m.keys().copied().collect();
            for k in keys {
                m.remove(&k);
            }
            proptest::prop_assert_eq!(m, ArtifactMap::default());
        }
    }

    #[test]
    fn a_snapshot_round_trip_rebuilds_the_index_and_keeps_the_plain_map_shape() {
        let m: ArtifactMap = [
            (PrefixKey(1), artifact(1, 3, true)),
            (PrefixKey(2), artifact(2, 7, false)),
        ]
        .into_iter()
        .collect();
        let json = serde_json::to_value(&m).expect("serialises");
        let plain = serde_json::to_value(&*m).expect("serialises");
        assert_eq!(json, plain);
        let back: ArtifactMap = serde_json::from_value(json).expect("deserialises");
        assert_eq!(back, m);
    }
}
