//! Engine KV events: the wire codec ([`msgpack`], [`wire`]), conversion to domain events
//! ([`normalize`]), the ZMQ publisher the simulated engine runs ([`publisher`]) and the
//! subscriber the router runs per worker ([`subscriber`]), with gap detection and replay.

pub mod msgpack;
pub mod normalize;
pub mod publisher;
pub mod redis_fanout;
pub mod shared_index;
pub mod subscriber;
pub mod wire;

#[cfg(test)]
mod golden_tests;
