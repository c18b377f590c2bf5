//! vLLM and SGLang KV-event wire formats (WIRE_FORMATS.md §1): ZMQ frames
//! `[topic, seq u64 BE, msgpack EventBatch]`; the batch `[ts, events, dp_rank]` (or, in one
//! vLLM commit, a map); each event either positional (`["BlockStored", hashes, parent,
//! tokens, block_size, lora_id, medium, lora_name, ...]`, legacy) or a map tagged by
//! `"type"` (vLLM ≥ #42892, SGLang ≥ #37482).
//!
//! Quirks handled, each with a test: shorter and longer positional arrays (fields were
//! added over time; extra trailing fields are ignored), signed int64 hashes (SGLang),
//! 32-byte digest hashes (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`: last 8 bytes, big
//! endian), a metadata map where `lora_name` used to be (SGLang's salted stores), EAGLE
//! bigram token ids `[[t, t'], ...]`, `attn_dp_rank` for `data_parallel_rank`, unknown
//! event types and keys (skipped).

use super::msgpack::{Int, MsgpackError, Reader, Value, Writer};

/// One event as the engine sent it; hashes are the engine's own opaque ids.
#[derive(Debug, Clone, PartialEq)]
pub enum WireEvent {
    BlockStored {
        block_hashes: Vec<u64>,
        parent_block_hash: Option<u64>,
        token_ids: Vec<u32>,
        block_size: u32,
        lora_name: Option<String>,
        /// Per block, a fingerprint of its `extra_keys` entry (0: none); `None` when the
        /// event has none at all.
        extra_keys: Option<Vec<u64>>,
        medium: Option<String>,
        group_idx: Option<i64>,
        kv_cache_spec_kind: Option<String>,
    },
    BlockRemoved {
        block_hashes: Vec<u64>,
        medium: Option<String>,
        group_idx: Option<i64>,
    },
    AllBlocksCleared,
    /// An event type we do not know; kept so callers can count it.
    Unknown(String),
}

/// A decoded batch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WireBatch {
    pub ts: f64,
    pub events: Vec<WireEvent>,
    /// `data_parallel_rank` (vLLM) or `attn_dp_rank` (SGLang).
    pub dp_rank: Option<i64>,
}

/// A ZMQ message: its sequence number and batch.
#[derive(Debug, Clone, PartialEq)]
pub struct WireMessage {
    pub seq: u64,
    pub batch: WireBatch,
}

/// Why bytes could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("expected 3 frames [topic, seq, payload], got {0}")]
    FrameCount(usize),
    #[error("sequence frame has {0} bytes, expected 8")]
    SeqFrame(usize),
    #[error("malformed msgpack")]
    Msgpack(#[from] MsgpackError),
    #[error("malformed {0}")]
    Shape(&'static str),
}

/// Decodes a 3-frame PUB message.
pub fn decode_message(frames: &[impl AsRef<[u8]>]) -> Result<WireMessage, DecodeError> {
    if frames.len() != 3 {
        return Err(DecodeError::FrameCount(frames.len()));
    }
    let seq = decode_seq(frames[1].as_ref())?;
    Ok(WireMessage {
        seq,
        batch: decode_batch(frames[2].as_ref())?,
    })
}

/// Reads an 8-byte big-endian sequence number.
pub fn decode_seq(frame: &[u8]) -> Result<u64, DecodeError> {
    let bytes: [u8; 8] = frame
        .try_into()
        .map_err(|_| DecodeError::SeqFrame(frame.len()))?;
    Ok(u64::from_be_bytes(bytes))
}

/// Decodes an `EventBatch` payload (positional or map form).
pub fn decode_batch(payload: &[u8]) -> Result<WireBatch, DecodeError> {
    let mut r = Reader::new(payload);
    let mut batch = WireBatch {
        ts: 0.0,
        events: Vec::new(),
        dp_rank: None,
    };
    match r.value()? {
        Value::Array(n) => {
            if n < 2 {
                return Err(DecodeError::Shape("batch: fewer than 2 fields"));
            }
            batch.ts = float(&mut r)?;
            batch.events = events(&mut r)?;
            if n >= 3 {
                batch.dp_rank = r.opt_int()?.and_then(Int::as_i64);
            }
            for _ in 3..n {
                r.skip()?;
            }
        }
        Value::Map(n) => {
            let mut saw_events = false;
            for _ in 0..n {
                match r.value()? {
                    Value::Str("ts") => batch.ts = float(&mut r)?,
                    Value::Str("events") => {
                        batch.events = events(&mut r)?;
                        saw_events = true;
                    }
                    Value::Str("data_parallel_rank" | "attn_dp_rank") => {
                        batch.dp_rank = r.opt_int()?.and_then(Int::as_i64);
                    }
                    _ => r.skip()?,
                }
            }
            if !saw_events {
                return Err(DecodeError::Shape("batch: no events"));
            }
        }
        _ => return Err(DecodeError::Shape("batch: not an array or map")),
    }
    Ok(batch)
}

fn float(r: &mut Reader<'_>) -> Result<f64, DecodeError> {
    match r.value()? {
        Value::Float(f) => Ok(f),
        Value::Int(i) => Ok(i.as_i64().unwrap_or(i64::MAX) as f64),
        _ => Err(DecodeError::Shape("ts: not a number")),
    }
}

fn events(r: &mut Reader<'_>) -> Result<Vec<WireEvent>, DecodeError> {
    let n = r.array()?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(event(r)?);
    }
    Ok(out)
}

fn hash(r: &mut Reader<'_>) -> Result<Option<u64>, DecodeError> {
    match r.value()? {
        Value::Nil => Ok(None),
        Value::Int(i) => Ok(Some(i.as_u64_bits())),
        // Raw digests: the last 8 bytes, big-endian (vLLM's `maybe_convert_block_hash`).
        Value::Bin(b) if !b.is_empty() => {
            let tail = &b[b.len().saturating_sub(8)..];
            Ok(Some(
                tail.iter().fold(0u64, |acc, &x| acc << 8 | u64::from(x)),
            ))
        }
        _ => Err(DecodeError::Shape("block hash")),
    }
}

fn hashes(r: &mut Reader<'_>) -> Result<Vec<u64>, DecodeError> {
    let n = r.array()?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(hash(r)?.ok_or(DecodeError::Shape("block hash: nil"))?);
    }
    Ok(out)
}

fn token(v: Value<'_>) -> Result<u32, DecodeError> {
    match v {
        Value::Int(Int::U(t)) => u32::try_from(t).map_err(|_| DecodeError::Shape("token id")),
        _ => Err(DecodeError::Shape("token id")),
    }
}

fn tokens(r: &mut Reader<'_>) -> Result<Vec<u32>, DecodeError> {
    let n = r.array()?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        match r.value()? {
            // EAGLE bigrams `[token, next_token]`: the block's content is the first.
            Value::Array(k) if k >= 1 => {
                out.push(token(r.value()?)?);
                for _ in 1..k {
                    r.skip()?;
                }
            }
            v => out.push(token(v)?),
        }
    }
    Ok(out)
}

fn opt_str(r: &mut Reader<'_>) -> Result<Option<String>, DecodeError> {
    Ok(r.lenient_str()?.map(str::to_owned))
}

fn opt_i64(r: &mut Reader<'_>) -> Result<Option<i64>, DecodeError> {
    Ok(r.opt_int()?.and_then(Int::as_i64))
}

fn event(r: &mut Reader<'_>) -> Result<WireEvent, DecodeError> {
    match r.value()? {
        Value::Array(n) => positional_event(r, n),
        Value::Map(n) => map_event(r, n),
        _ => Err(DecodeError::Shape("event: not an array or map")),
    }
}

fn positional_event(r: &mut Reader<'_>, n: usize) -> Result<WireEvent, DecodeError> {
    let tag = match r.value()? {
        Value::Str(s) => s,
        _ => return Err(DecodeError::Shape("event tag")),
    };
    let mut left = n.saturating_sub(1);
    // Reads the next positional field if the array has one.
    macro_rules! field {
        ($read:expr, $default:expr) => {
            if left > 0 {
                left -= 1;
                $read
            } else {
                $default
            }
        };
    }
    let ev = match tag {
        "BlockStored" => {
            let block_hashes = field!(hashes(r)?, Vec::new());
            let parent_block_hash = field!(hash(r)?, None);
            let token_ids = field!(tokens(r)?, Vec::new());
            let block_size = field!(r.opt_int()?.map_or(0, |i| i.as_u64_bits() as u32), 0);
            field!(r.skip()?, ()); // lora_id (deprecated)
            let medium = field!(opt_str(r)?, None);
            let lora_name = field!(opt_str(r)?, None);
            let extra_keys = field!(extra_keys(r)?, None);
            let group_idx = field!(opt_i64(r)?, None);
            let kv_cache_spec_kind = field!(opt_str(r)?, None);
            WireEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                lora_name,
                extra_keys,
                medium,
                group_idx,
                kv_cache_spec_kind,
            }
        }
        "BlockRemoved" => {
            let block_hashes = field!(hashes(r)?, Vec::new());
            let medium = field!(opt_str(r)?, None);
            let group_idx = field!(opt_i64(r)?, None);
            WireEvent::BlockRemoved {
                block_hashes,
                medium,
                group_idx,
            }
        }
        "AllBlocksCleared" => WireEvent::AllBlocksCleared,
        other => WireEvent::Unknown(other.to_owned()),
    };
    for _ in 0..left {
        r.skip()?;
    }
    Ok(ev)
}

fn map_event(r: &mut Reader<'_>, n: usize) -> Result<WireEvent, DecodeError> {
    let mut tag = None;
    let mut block_hashes = Vec::new();
    let mut parent_block_hash = None;
    let mut token_ids = Vec::new();
    let mut block_size = 0;
    let mut lora_name = None;
    let mut extra = None;
    let mut medium = None;
    let mut group_idx = None;
    let mut kind = None;
    for _ in 0..n {
        match r.value()? {
            Value::Str("type") => tag = opt_str(r)?,
            Value::Str("block_hashes") => block_hashes = hashes(r)?,
            Value::Str("parent_block_hash") => parent_block_hash = hash(r)?,
            Value::Str("token_ids") => token_ids = tokens(r)?,
            Value::Str("block_size") => {
                block_size = r.opt_int()?.map_or(0, |i| i.as_u64_bits() as u32)
            }
            Value::Str("lora_name") => lora_name = opt_str(r)?,
            Value::Str("extra_keys") => extra = extra_keys(r)?,
            Value::Str("medium") => medium = opt_str(r)?,
            Value::Str("group_idx") => group_idx = opt_i64(r)?,
            Value::Str("kv_cache_spec_kind") => kind = opt_str(r)?,
            _ => r.skip()?,
        }
    }
    Ok(match tag.as_deref() {
        Some("BlockStored") => WireEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            lora_name,
            extra_keys: extra,
            medium,
            group_idx,
            kv_cache_spec_kind: kind,
        },
        Some("BlockRemoved") => WireEvent::BlockRemoved {
            block_hashes,
            medium,
            group_idx,
        },
        Some("AllBlocksCleared") => WireEvent::AllBlocksCleared,
        Some(other) => WireEvent::Unknown(other.to_owned()),
        None => return Err(DecodeError::Shape("event: no \"type\"")),
    })
}

/// `extra_keys`: nil, or per block nil or the keys (a tuple of multimodal hashes, a cache
/// salt, ...), each fingerprinted by its msgpack bytes. All-nil is none.
fn extra_keys(r: &mut Reader<'_>) -> Result<Option<Vec<u64>>, DecodeError> {
    if r.peek_nil() {
        r.skip()?;
        return Ok(None);
    }
    let n = r.array()?;
    let mut out = Vec::with_capacity(n.min(4096));
    for _ in 0..n {
        out.push(if r.peek_nil() {
            r.skip()?;
            0
        } else {
            // Never 0, which means "none".
            xxhash_rust::xxh3::xxh3_64(r.raw()?).max(1)
        });
    }
    Ok(out.iter().any(|&k| k != 0).then_some(out))
}

/// How events are laid out on the wire (the outer batch is always positional).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// Tagged maps (vLLM after #42892, SGLang after #37482).
    #[default]
    Map,
    /// Positional arrays (vLLM up to ~0.23, older SGLang).
    Array,
}

/// Encodes a batch the way vLLM's msgspec publisher does (every positional slot written,
/// defaults omitted from maps).
pub fn encode_batch(batch: &WireBatch, encoding: Encoding) -> Vec<u8> {
    let mut w = Writer::default();
    w.array(3);
    w.float(batch.ts);
    w.array(batch.events.len());
    for ev in &batch.events {
        encode_event(&mut w, ev, encoding);
    }
    match batch.dp_rank {
        Some(r) => w.uint(r.max(0) as u64),
        None => w.nil(),
    }
    w.buf
}

fn opt(w: &mut Writer, v: Option<&str>) {
    match v {
        Some(s) => w.str(s),
        None => w.nil(),
    }
}

fn encode_event(w: &mut Writer, ev: &WireEvent, encoding: Encoding) {
    let uints = |w: &mut Writer, v: &[u64]| {
        w.array(v.len());
        for &x in v {
            w.uint(x);
        }
    };
    match (ev, encoding) {
        (
            WireEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                lora_name,
                medium,
                ..
            },
            enc,
        ) => {
            let parent = |w: &mut Writer| match parent_block_hash {
                Some(p) => w.uint(*p),
                None => w.nil(),
            };
            let toks = |w: &mut Writer| {
                w.array(token_ids.len());
                for &t in token_ids {
                    w.uint(u64::from(t));
                }
            };
            if enc == Encoding::Array {
                // msgspec writes every slot of an array_like struct, defaults included.
                w.array(12);
                w.str("BlockStored");
                uints(w, block_hashes);
                parent(w);
                toks(w);
                w.uint(u64::from(*block_size));
                w.nil();
                opt(w, medium.as_deref());
                opt(w, lora_name.as_deref());
                for _ in 0..4 {
                    w.nil();
                }
            } else {
                w.map(8);
                w.str("type");
                w.str("BlockStored");
                w.str("block_hashes");
                uints(w, block_hashes);
                w.str("parent_block_hash");
                parent(w);
                w.str("token_ids");
                toks(w);
                w.str("block_size");
                w.uint(u64::from(*block_size));
                w.str("lora_id");
                w.nil();
                w.str("medium");
                opt(w, medium.as_deref());
                w.str("lora_name");
                opt(w, lora_name.as_deref());
            }
        }
        (
            WireEvent::BlockRemoved {
                block_hashes,
                medium,
                ..
            },
            Encoding::Array,
        ) => {
            w.array(4);
            w.str("BlockRemoved");
            uints(w, block_hashes);
            opt(w, medium.as_deref());
            w.nil();
        }
        (
            WireEvent::BlockRemoved {
                block_hashes,
                medium,
                ..
            },
            Encoding::Map,
        ) => {
            w.map(3);
            w.str("type");
            w.str("BlockRemoved");
            w.str("block_hashes");
            uints(w, block_hashes);
            w.str("medium");
            opt(w, medium.as_deref());
        }
        (WireEvent::AllBlocksCleared, Encoding::Array) => {
            w.array(1);
            w.str("AllBlocksCleared");
        }
        (WireEvent::AllBlocksCleared, Encoding::Map) => {
            w.map(1);
            w.str("type");
            w.str("AllBlocksCleared");
        }
        (WireEvent::Unknown(tag), _) => {
            w.array(1);
            w.str(tag);
        }
    }
}
