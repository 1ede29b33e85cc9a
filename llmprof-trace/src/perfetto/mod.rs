//! Perfetto output: the wire schema ([`schema`]), the streaming file writer with interning ([`writer`]) and
//! the sink that lays llmprof events out as tracks ([`sink`]).

pub mod compact;
pub mod schema;
pub mod sink;
pub mod writer;

pub use sink::{EventCounts, TraceSink};
