//! The directory's prefix artifacts by key, with the block counts they end at.
//!
//! A prompt's owned prefix can only end at a block count some artifact ends at (an
//! artifact is keyed by the chain hash of its last block, `blocks.1`), so a lookup probes
//! the prompt's hash at those block counts, longest first, instead of at every block: a
//! brand-new 2,048-block prompt costs one probe per distinct artifact length at most, not
//! 2,048 misses. The index is derived from the artifacts alone, so it is not part of a
//! snapshot: deserialising rebuilds it, and two maps with the same artifacts are equal.

use std::collections::BTreeMap;
use std::ops::Deref;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::ids::PrefixKey;
use crate::state::Artifact;

/// Artifacts by key (read through `Deref` as the ordered map) plus the count of artifacts
/// ending at each block count. Inserting goes through [`ArtifactMap::insert`] so the counts
/// stay true; an artifact's `blocks` never change after it is created.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArtifactMap {
    by_key: BTreeMap<PrefixKey, Artifact>,
    ends: BTreeMap<u32, u32>,
}

impl ArtifactMap {
    /// Adds or replaces `key`'s artifact; the replaced one, if any.
    pub fn insert(&mut self, key: PrefixKey, artifact: Artifact) -> Option<Artifact> {
        *self.ends.entry(artifact.blocks.1).or_default() += 1;
        let old = self.by_key.insert(key, artifact)?;
        self.forget_end(old.blocks.1);
        Some(old)
    }

    /// `key`'s artifact, to change its owner, locations, counts or access time (never its
    /// `blocks`, which the end index was built from).
    pub fn get_mut(&mut self, key: &PrefixKey) -> Option<&mut Artifact> {
        self.by_key.get_mut(key)
    }

    /// Every artifact, to change what [`ArtifactMap::get_mut`] may change.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut Artifact> {
        self.by_key.values_mut()
    }

    /// The block counts at which some artifact ends, from `max` down to 1.
    pub fn ends_down_from(&self, max: u32) -> impl Iterator<Item = u32> + '_ {
        self.ends
            .range(..=max)
            .rev()
            .map(|(&end, _)| end)
            .take_while(|&end| end > 0)
    }

    fn forget_end(&mut self, end: u32) {
        if let Some(n) = self.ends.get_mut(&end) {
            *n -= 1;
            if *n == 0 {
                self.ends.remove(&end);
            }
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

    fn artifact(end: u32) -> Artifact {
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
        }
    }

    #[test]
    fn ends_are_counted_per_length_and_follow_replacements() {
        let mut m = ArtifactMap::default();
        m.insert(PrefixKey(1), artifact(4));
        m.insert(PrefixKey(2), artifact(4));
        m.insert(PrefixKey(3), artifact(9));
        assert_eq!(m.ends_down_from(100).collect::<Vec<_>>(), vec![9, 4]);
        assert_eq!(m.ends_down_from(8).collect::<Vec<_>>(), vec![4]);
        // Replacing key 3's artifact with one ending at 4 drops length 9.
        m.insert(PrefixKey(3), artifact(4));
        assert_eq!(m.ends_down_from(100).collect::<Vec<_>>(), vec![4]);
        assert_eq!(m.ends, BTreeMap::from([(4, 3)]));
        // A zero-length artifact ends nowhere a prompt can own.
        m.insert(PrefixKey(5), artifact(0));
        assert_eq!(m.ends_down_from(100).collect::<Vec<_>>(), vec![4]);
    }

    #[test]
    fn a_snapshot_round_trip_rebuilds_the_index_and_keeps_the_plain_map_shape() {
        let m: ArtifactMap = [(PrefixKey(1), artifact(3)), (PrefixKey(2), artifact(7))]
            .into_iter()
            .collect();
        let json = serde_json::to_value(&m).expect("serialises");
        let plain = serde_json::to_value(&*m).expect("serialises");
        assert_eq!(json, plain);
        let back: ArtifactMap = serde_json::from_value(json).expect("deserialises");
        assert_eq!(back, m);
        assert_eq!(back.ends_down_from(10).collect::<Vec<_>>(), vec![7, 3]);
    }
}
