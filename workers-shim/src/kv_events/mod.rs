//! Engine KV events: the wire codec ([`msgpack`], [`wire`]) and conversion to domain
//! events ([`normalize`]), all pure; with the `io` feature, the ZMQ publisher the simulated
//! engine runs (`publisher`), the subscriber the router runs per worker (`subscriber`, with
//! gap detection and replay), the index they feed (`shared_index`) and the Redis fan-out
//! between router replicas (`redis_fanout`).

pub mod msgpack;
pub mod normalize;
#[cfg(feature = "io")]
pub mod publisher;
#[cfg(feature = "io")]
pub mod redis_fanout;
#[cfg(feature = "io")]
pub mod shared_index;
#[cfg(feature = "io")]
pub mod subscriber;
pub mod wire;

#[cfg(test)]
mod golden_tests;
