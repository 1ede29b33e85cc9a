//! The subset of Perfetto's trace protos llmprof writes, as hand-written prost messages.
//!
//! Owns field numbers only: every tag quotes the line of `google/perfetto` `protos/perfetto/...` it mirrors
//! (wrong numbers are silent garbage, so a test decodes our output and the e2e tests load it in the real trace
//! processor). Nothing here knows about llmprof events; see `sink.rs` for that.

/// `protos/perfetto/trace/trace.proto`: `message Trace { repeated TracePacket packet = 1; }`.
/// The file is this message; the writer streams it one `packet` field at a time.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Trace {
    /// `repeated TracePacket packet = 1;`
    #[prost(message, repeated, tag = "1")]
    pub packet: Vec<TracePacket>,
}

/// Wire tag of `Trace.packet` (field 1, length-delimited): the byte before each streamed packet.
pub const TRACE_PACKET_TAG: u8 = (1 << 3) | 2;

/// `protos/perfetto/trace/trace_packet.proto`: `message TracePacket`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TracePacket {
    /// `optional uint64 timestamp = 8;`
    #[prost(uint64, optional, tag = "8")]
    pub timestamp: Option<u64>,
    /// `optional uint32 timestamp_clock_id = 58;`
    #[prost(uint32, optional, tag = "58")]
    pub timestamp_clock_id: Option<u32>,
    /// `uint32 trusted_packet_sequence_id = 10;` (oneof optional_trusted_packet_sequence_id)
    #[prost(uint32, optional, tag = "10")]
    pub trusted_packet_sequence_id: Option<u32>,
    /// `optional uint32 sequence_flags = 13;` (see [`SEQ_INCREMENTAL_STATE_CLEARED`]).
    #[prost(uint32, optional, tag = "13")]
    pub sequence_flags: Option<u32>,
    /// `optional InternedData interned_data = 12;`
    #[prost(message, optional, tag = "12")]
    pub interned_data: Option<InternedData>,
    /// `ClockSnapshot clock_snapshot = 6;` (oneof data)
    #[prost(message, optional, tag = "6")]
    pub clock_snapshot: Option<ClockSnapshot>,
    /// `TrackEvent track_event = 11;` (oneof data)
    #[prost(message, optional, tag = "11")]
    pub track_event: Option<TrackEvent>,
    /// `TrackDescriptor track_descriptor = 60;` (oneof data)
    #[prost(message, optional, tag = "60")]
    pub track_descriptor: Option<TrackDescriptor>,
    /// `FtraceEventBundle ftrace_events = 1;` (oneof data)
    #[prost(message, optional, tag = "1")]
    pub ftrace_events: Option<FtraceEventBundle>,
    /// `SystemInfo system_info = 45;` (oneof data)
    #[prost(message, optional, tag = "45")]
    pub system_info: Option<SystemInfo>,
    /// `PerfSample perf_sample = 66;` (oneof data): one CPU stack sample ([`PerfSample`]).
    #[prost(message, optional, tag = "66")]
    pub perf_sample: Option<PerfSample>,
}

/// `TracePacket.SequenceFlags.SEQ_INCREMENTAL_STATE_CLEARED = 1;`
pub const SEQ_INCREMENTAL_STATE_CLEARED: u32 = 1;
/// `TracePacket.SequenceFlags.SEQ_NEEDS_INCREMENTAL_STATE = 2;`
pub const SEQ_NEEDS_INCREMENTAL_STATE: u32 = 2;

/// `protos/perfetto/common/builtin_clock.proto`: `BUILTIN_CLOCK_REALTIME = 1;`
pub const CLOCK_REALTIME: u32 = 1;
/// `protos/perfetto/common/builtin_clock.proto`: `BUILTIN_CLOCK_MONOTONIC = 3;`
pub const CLOCK_MONOTONIC: u32 = 3;
/// `protos/perfetto/common/builtin_clock.proto`: `BUILTIN_CLOCK_BOOTTIME = 6;` (the default trace clock).
pub const CLOCK_BOOTTIME: u32 = 6;

/// `protos/perfetto/trace/clock_snapshot.proto`: `message ClockSnapshot`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ClockSnapshot {
    /// `repeated Clock clocks = 1;`
    #[prost(message, repeated, tag = "1")]
    pub clocks: Vec<Clock>,
    /// `optional BuiltinClock primary_trace_clock = 2;`
    #[prost(uint32, optional, tag = "2")]
    pub primary_trace_clock: Option<u32>,
}

/// `ClockSnapshot.Clock`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Clock {
    /// `optional uint32 clock_id = 1;`
    #[prost(uint32, optional, tag = "1")]
    pub clock_id: Option<u32>,
    /// `optional uint64 timestamp = 2;`
    #[prost(uint64, optional, tag = "2")]
    pub timestamp: Option<u64>,
}

/// `protos/perfetto/trace/interned_data/interned_data.proto`: `message InternedData`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct InternedData {
    /// `repeated EventName event_names = 2;`
    #[prost(message, repeated, tag = "2")]
    pub event_names: Vec<InternedString>,
    /// `repeated DebugAnnotationName debug_annotation_names = 3;`
    #[prost(message, repeated, tag = "3")]
    pub debug_annotation_names: Vec<InternedString>,
    /// `repeated InternedString mapping_paths = 17;` (paths of executable files; profile_common.proto's
    /// `InternedString` is `iid = 1; bytes str = 2;`, the same wire layout as [`InternedString`]).
    #[prost(message, repeated, tag = "17")]
    pub mapping_paths: Vec<InternedString>,
    /// `repeated InternedString source_paths = 18;`
    #[prost(message, repeated, tag = "18")]
    pub source_paths: Vec<InternedString>,
    /// `repeated InternedString function_names = 5;`
    #[prost(message, repeated, tag = "5")]
    pub function_names: Vec<InternedString>,
    /// `repeated Mapping mappings = 19;`
    #[prost(message, repeated, tag = "19")]
    pub mappings: Vec<Mapping>,
    /// `repeated Frame frames = 6;`
    #[prost(message, repeated, tag = "6")]
    pub frames: Vec<Frame>,
    /// `repeated Callstack callstacks = 7;`
    #[prost(message, repeated, tag = "7")]
    pub callstacks: Vec<Callstack>,
    /// `repeated InternedString kernel_symbols = 26;` (what `sched_blocked_reason.caller` names)
    #[prost(message, repeated, tag = "26")]
    pub kernel_symbols: Vec<InternedString>,
}

impl InternedData {
    /// Whether nothing new is interned (the packet then carries no `interned_data`).
    pub fn is_empty(&self) -> bool {
        self.event_names.is_empty()
            && self.debug_annotation_names.is_empty()
            && self.mapping_paths.is_empty()
            && self.source_paths.is_empty()
            && self.function_names.is_empty()
            && self.mappings.is_empty()
            && self.frames.is_empty()
            && self.callstacks.is_empty()
            && self.kernel_symbols.is_empty()
    }
}

// ---- CPU stack samples: protos/perfetto/trace/profiling/profile_common.proto and profile_packet.proto ----
// The trace processor turns these into `stack_profile_mapping`, `stack_profile_frame`,
// `stack_profile_callsite` and `perf_sample`; the UI draws a flame graph for a selected time range and thread.

/// `profile_common.proto`: `message Mapping` (an executable file mapped into a process).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Mapping {
    /// `optional uint64 iid = 1;`
    #[prost(uint64, optional, tag = "1")]
    pub iid: Option<u64>,
    /// `optional uint64 start = 4;`
    #[prost(uint64, optional, tag = "4")]
    pub start: Option<u64>,
    /// `optional uint64 end = 5;`
    #[prost(uint64, optional, tag = "5")]
    pub end: Option<u64>,
    /// `repeated uint64 path_string_ids = 7;` (iids of `InternedData.mapping_paths`, one per path component).
    #[prost(uint64, repeated, packed = "false", tag = "7")]
    pub path_string_ids: Vec<u64>,
}

/// `profile_common.proto`: `message Frame`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Frame {
    /// `optional uint64 iid = 1;`
    #[prost(uint64, optional, tag = "1")]
    pub iid: Option<u64>,
    /// `optional uint64 function_name_id = 2;` (iid of `InternedData.function_names`)
    #[prost(uint64, optional, tag = "2")]
    pub function_name_id: Option<u64>,
    /// `optional uint64 mapping_id = 3;` (iid of `InternedData.mappings`; needs `rel_pc`)
    #[prost(uint64, optional, tag = "3")]
    pub mapping_id: Option<u64>,
    /// `optional uint64 rel_pc = 4;`
    #[prost(uint64, optional, tag = "4")]
    pub rel_pc: Option<u64>,
    /// `optional uint64 source_path_iid = 5;` (iid of `InternedData.source_paths`; newer trace processors)
    #[prost(uint64, optional, tag = "5")]
    pub source_path_iid: Option<u64>,
    /// `optional uint32 line_number = 6;`
    #[prost(uint32, optional, tag = "6")]
    pub line_number: Option<u32>,
    /// `Kind kind = 7;` (oneof kind_field; [`FRAME_KIND_NATIVE`], ...)
    #[prost(int32, optional, tag = "7")]
    pub kind: Option<i32>,
}

/// `Frame.Kind.KIND_NATIVE = 1;`
pub const FRAME_KIND_NATIVE: i32 = 1;
/// `Frame.Kind.KIND_KERNEL = 2;`
pub const FRAME_KIND_KERNEL: i32 = 2;
/// `Frame.Kind.KIND_INTERPRETED = 3;`
pub const FRAME_KIND_INTERPRETED: i32 = 3;
/// `Frame.Kind.KIND_JIT = 4;`
pub const FRAME_KIND_JIT: i32 = 4;

/// `profile_common.proto`: `message Callstack`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Callstack {
    /// `optional uint64 iid = 1;`
    #[prost(uint64, optional, tag = "1")]
    pub iid: Option<u64>,
    /// `repeated uint64 frame_ids = 2;` ("Frames of this callstack. Bottom frame first.": the outermost
    /// frame, e.g. `_start`, comes first).
    #[prost(uint64, repeated, packed = "false", tag = "2")]
    pub frame_ids: Vec<u64>,
}

/// `profile_packet.proto`: `message PerfSample` (one sample of a CPU's perf event).
#[derive(Clone, PartialEq, prost::Message)]
pub struct PerfSample {
    /// `optional uint32 cpu = 1;`
    #[prost(uint32, optional, tag = "1")]
    pub cpu: Option<u32>,
    /// `optional uint32 pid = 2;`
    #[prost(uint32, optional, tag = "2")]
    pub pid: Option<u32>,
    /// `optional uint32 tid = 3;`
    #[prost(uint32, optional, tag = "3")]
    pub tid: Option<u32>,
    /// `optional uint64 callstack_iid = 4;`
    #[prost(uint64, optional, tag = "4")]
    pub callstack_iid: Option<u64>,
    /// `optional Profiling.CpuMode cpu_mode = 5;` ([`CPU_MODE_KERNEL`], [`CPU_MODE_USER`])
    #[prost(int32, optional, tag = "5")]
    pub cpu_mode: Option<i32>,
}

/// `Profiling.CpuMode.MODE_KERNEL = 1;`
pub const CPU_MODE_KERNEL: i32 = 1;
/// `Profiling.CpuMode.MODE_USER = 2;`
pub const CPU_MODE_USER: i32 = 2;

/// `EventName` / `DebugAnnotationName` (same layout): `optional uint64 iid = 1; optional string name = 2;`
#[derive(Clone, PartialEq, prost::Message)]
pub struct InternedString {
    /// `optional uint64 iid = 1;`
    #[prost(uint64, optional, tag = "1")]
    pub iid: Option<u64>,
    /// `optional string name = 2;`
    #[prost(string, optional, tag = "2")]
    pub name: Option<String>,
}

/// `protos/perfetto/trace/track_event/track_descriptor.proto`: `message TrackDescriptor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TrackDescriptor {
    /// `optional uint64 uuid = 1;`
    #[prost(uint64, optional, tag = "1")]
    pub uuid: Option<u64>,
    /// `optional uint64 parent_uuid = 5;`
    #[prost(uint64, optional, tag = "5")]
    pub parent_uuid: Option<u64>,
    /// `string name = 2;` (oneof static_or_dynamic_name)
    #[prost(string, optional, tag = "2")]
    pub name: Option<String>,
    /// `optional ProcessDescriptor process = 3;`
    #[prost(message, optional, tag = "3")]
    pub process: Option<ProcessDescriptor>,
    /// `optional ThreadDescriptor thread = 4;`
    #[prost(message, optional, tag = "4")]
    pub thread: Option<ThreadDescriptor>,
    /// `optional CounterDescriptor counter = 8;`
    #[prost(message, optional, tag = "8")]
    pub counter: Option<CounterDescriptor>,
}

/// `protos/perfetto/trace/track_event/process_descriptor.proto`: `message ProcessDescriptor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProcessDescriptor {
    /// `optional int32 pid = 1;`
    #[prost(int32, optional, tag = "1")]
    pub pid: Option<i32>,
    /// `repeated string cmdline = 2;`
    #[prost(string, repeated, tag = "2")]
    pub cmdline: Vec<String>,
    /// `optional string process_name = 6;`
    #[prost(string, optional, tag = "6")]
    pub process_name: Option<String>,
}

/// `protos/perfetto/trace/track_event/thread_descriptor.proto`: `message ThreadDescriptor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ThreadDescriptor {
    /// `optional int32 pid = 1;`
    #[prost(int32, optional, tag = "1")]
    pub pid: Option<i32>,
    /// `optional int32 tid = 2;`
    #[prost(int32, optional, tag = "2")]
    pub tid: Option<i32>,
    /// `optional string thread_name = 5;`
    #[prost(string, optional, tag = "5")]
    pub thread_name: Option<String>,
}

/// `protos/perfetto/trace/track_event/counter_descriptor.proto`: `message CounterDescriptor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CounterDescriptor {
    /// `optional string unit_name = 6;`
    #[prost(string, optional, tag = "6")]
    pub unit_name: Option<String>,
    /// `optional bool is_incremental = 5;`
    #[prost(bool, optional, tag = "5")]
    pub is_incremental: Option<bool>,
}

/// `protos/perfetto/trace/track_event/track_event.proto`: `message TrackEvent`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TrackEvent {
    /// `optional Type type = 9;` (see [`TYPE_SLICE_BEGIN`] ...).
    #[prost(int32, optional, tag = "9")]
    pub r#type: Option<i32>,
    /// `optional uint64 track_uuid = 11;`
    #[prost(uint64, optional, tag = "11")]
    pub track_uuid: Option<u64>,
    /// `uint64 name_iid = 10;` (oneof name_field, interned EventName)
    #[prost(uint64, optional, tag = "10")]
    pub name_iid: Option<u64>,
    /// `string name = 23;` (oneof name_field, non-interned)
    #[prost(string, optional, tag = "23")]
    pub name: Option<String>,
    /// `repeated string categories = 22;`
    #[prost(string, repeated, tag = "22")]
    pub categories: Vec<String>,
    /// `repeated DebugAnnotation debug_annotations = 4;`
    #[prost(message, repeated, tag = "4")]
    pub debug_annotations: Vec<DebugAnnotation>,
    /// `int64 counter_value = 30;` (oneof counter_value_field)
    #[prost(int64, optional, tag = "30")]
    pub counter_value: Option<i64>,
    /// `double double_counter_value = 44;` (oneof counter_value_field)
    #[prost(double, optional, tag = "44")]
    pub double_counter_value: Option<f64>,
    /// `repeated fixed64 flow_ids = 47;`
    #[prost(fixed64, repeated, packed = "false", tag = "47")]
    pub flow_ids: Vec<u64>,
    /// `repeated fixed64 terminating_flow_ids = 48;`
    #[prost(fixed64, repeated, packed = "false", tag = "48")]
    pub terminating_flow_ids: Vec<u64>,
}

/// `TrackEvent.Type.TYPE_SLICE_BEGIN = 1;`
pub const TYPE_SLICE_BEGIN: i32 = 1;
/// `TrackEvent.Type.TYPE_SLICE_END = 2;`
pub const TYPE_SLICE_END: i32 = 2;
/// `TrackEvent.Type.TYPE_INSTANT = 3;`
pub const TYPE_INSTANT: i32 = 3;
/// `TrackEvent.Type.TYPE_COUNTER = 4;`
pub const TYPE_COUNTER: i32 = 4;

/// `protos/perfetto/trace/track_event/debug_annotation.proto`: `message DebugAnnotation`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DebugAnnotation {
    /// `uint64 name_iid = 1;` (oneof name_field, interned DebugAnnotationName)
    #[prost(uint64, optional, tag = "1")]
    pub name_iid: Option<u64>,
    /// `string name = 10;` (oneof name_field)
    #[prost(string, optional, tag = "10")]
    pub name: Option<String>,
    /// `bool bool_value = 2;` (oneof value)
    #[prost(bool, optional, tag = "2")]
    pub bool_value: Option<bool>,
    /// `uint64 uint_value = 3;` (oneof value)
    #[prost(uint64, optional, tag = "3")]
    pub uint_value: Option<u64>,
    /// `int64 int_value = 4;` (oneof value)
    #[prost(int64, optional, tag = "4")]
    pub int_value: Option<i64>,
    /// `double double_value = 5;` (oneof value)
    #[prost(double, optional, tag = "5")]
    pub double_value: Option<f64>,
    /// `string string_value = 6;` (oneof value)
    #[prost(string, optional, tag = "6")]
    pub string_value: Option<String>,
    /// `repeated DebugAnnotation array_values = 12;` (an array: the elements carry values, no names)
    #[prost(message, repeated, tag = "12")]
    pub array_values: Vec<DebugAnnotation>,
}

/// `protos/perfetto/common/system_info.proto`: `message SystemInfo` (the kernel release tells the trace
/// processor how to read `sched_switch.prev_state`: 4.14+ kernels report preemption as 0x100).
#[derive(Clone, PartialEq, prost::Message)]
pub struct SystemInfo {
    /// `optional Utsname utsname = 1;`
    #[prost(message, optional, tag = "1")]
    pub utsname: Option<Utsname>,
}

/// `protos/perfetto/common/system_info.proto`: `message Utsname`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Utsname {
    /// `optional string sysname = 1;`
    #[prost(string, optional, tag = "1")]
    pub sysname: Option<String>,
    /// `optional string release = 3;`
    #[prost(string, optional, tag = "3")]
    pub release: Option<String>,
}

/// `protos/perfetto/trace/ftrace/ftrace_event_bundle.proto`: `message FtraceEventBundle` (the events of one
/// CPU, in time order).
#[derive(Clone, PartialEq, prost::Message)]
pub struct FtraceEventBundle {
    /// `optional uint32 cpu = 1;`
    #[prost(uint32, optional, tag = "1")]
    pub cpu: Option<u32>,
    /// `repeated FtraceEvent event = 2;`
    #[prost(message, repeated, tag = "2")]
    pub event: Vec<FtraceEvent>,
    /// `optional CompactSched compact_sched = 4;`
    #[prost(message, optional, tag = "4")]
    pub compact_sched: Option<CompactSched>,
}

/// `FtraceEventBundle.CompactSched`: sched_switch and sched_waking events of one CPU as packed arrays (one entry
/// per event in each), timestamps as deltas from the previous one of the same kind (the first from 0), comms
/// as indexes into `intern_table`. A switch's `prev` and a waking's waker are the thread the previous switch on
/// that CPU put there ([`crate::perfetto::compact`]).
#[derive(Clone, PartialEq, prost::Message)]
pub struct CompactSched {
    /// `repeated uint64 switch_timestamp = 1 [packed = true];`
    #[prost(uint64, repeated, packed = "true", tag = "1")]
    pub switch_timestamp: Vec<u64>,
    /// `repeated int64 switch_prev_state = 2 [packed = true];`
    #[prost(int64, repeated, packed = "true", tag = "2")]
    pub switch_prev_state: Vec<i64>,
    /// `repeated int32 switch_next_pid = 3 [packed = true];`
    #[prost(int32, repeated, packed = "true", tag = "3")]
    pub switch_next_pid: Vec<i32>,
    /// `repeated int32 switch_next_prio = 4 [packed = true];`
    #[prost(int32, repeated, packed = "true", tag = "4")]
    pub switch_next_prio: Vec<i32>,
    /// `repeated string intern_table = 5;`
    #[prost(string, repeated, tag = "5")]
    pub intern_table: Vec<String>,
    /// `repeated uint32 switch_next_comm_index = 6 [packed = true];`
    #[prost(uint32, repeated, packed = "true", tag = "6")]
    pub switch_next_comm_index: Vec<u32>,
    /// `repeated uint64 waking_timestamp = 7 [packed = true];`
    #[prost(uint64, repeated, packed = "true", tag = "7")]
    pub waking_timestamp: Vec<u64>,
    /// `repeated int32 waking_pid = 8 [packed = true];`
    #[prost(int32, repeated, packed = "true", tag = "8")]
    pub waking_pid: Vec<i32>,
    /// `repeated int32 waking_target_cpu = 9 [packed = true];`
    #[prost(int32, repeated, packed = "true", tag = "9")]
    pub waking_target_cpu: Vec<i32>,
    /// `repeated int32 waking_prio = 10 [packed = true];`
    #[prost(int32, repeated, packed = "true", tag = "10")]
    pub waking_prio: Vec<i32>,
    /// `repeated uint32 waking_comm_index = 11 [packed = true];`
    #[prost(uint32, repeated, packed = "true", tag = "11")]
    pub waking_comm_index: Vec<u32>,
    /// `repeated uint32 waking_common_flags = 12 [packed = true];`
    #[prost(uint32, repeated, packed = "true", tag = "12")]
    pub waking_common_flags: Vec<u32>,
}

/// `protos/perfetto/trace/ftrace/ftrace_event.proto`: `message FtraceEvent` (the subset llmprof writes).
#[derive(Clone, PartialEq, prost::Message)]
pub struct FtraceEvent {
    /// `optional uint64 timestamp = 1;` (the trace clock: BOOTTIME here)
    #[prost(uint64, optional, tag = "1")]
    pub timestamp: Option<u64>,
    /// `optional uint32 pid = 2;` (the tracepoint's current task: for sched_waking, the waker)
    #[prost(uint32, optional, tag = "2")]
    pub pid: Option<u32>,
    /// `optional uint32 common_flags = 5;`
    #[prost(uint32, optional, tag = "5")]
    pub common_flags: Option<u32>,
    /// `SchedSwitchFtraceEvent sched_switch = 4;` (oneof event)
    #[prost(message, optional, tag = "4")]
    pub sched_switch: Option<SchedSwitchFtraceEvent>,
    /// `SchedWakingFtraceEvent sched_waking = 20;` (oneof event)
    #[prost(message, optional, tag = "20")]
    pub sched_waking: Option<SchedWakingFtraceEvent>,
    /// `SchedBlockedReasonFtraceEvent sched_blocked_reason = 18;` (oneof event)
    #[prost(message, optional, tag = "18")]
    pub sched_blocked_reason: Option<SchedBlockedReasonFtraceEvent>,
}

/// `protos/perfetto/trace/ftrace/sched.proto`: `message SchedBlockedReasonFtraceEvent`. The trace processor
/// (`FtraceParser::ParseSchedBlockedReason`) looks `caller` up in the sequence's interned
/// [`InternedData::kernel_symbols`] and sets `blocked_function` on the thread's last blocked `thread_state` row,
/// which Perfetto UI shows as "Blocked function" in the thread state's details.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SchedBlockedReasonFtraceEvent {
    /// `optional int32 pid = 1;` (the blocked thread)
    #[prost(int32, optional, tag = "1")]
    pub pid: Option<i32>,
    /// `optional uint64 caller = 2;` (an iid of `InternedData.kernel_symbols`)
    #[prost(uint64, optional, tag = "2")]
    pub caller: Option<u64>,
    /// `optional uint32 io_wait = 3;`
    #[prost(uint32, optional, tag = "3")]
    pub io_wait: Option<u32>,
}

/// `protos/perfetto/trace/ftrace/sched.proto`: `message SchedSwitchFtraceEvent`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SchedSwitchFtraceEvent {
    /// `optional string prev_comm = 1;`
    #[prost(string, optional, tag = "1")]
    pub prev_comm: Option<String>,
    /// `optional int32 prev_pid = 2;`
    #[prost(int32, optional, tag = "2")]
    pub prev_pid: Option<i32>,
    /// `optional int32 prev_prio = 3;`
    #[prost(int32, optional, tag = "3")]
    pub prev_prio: Option<i32>,
    /// `optional int64 prev_state = 4;`
    #[prost(int64, optional, tag = "4")]
    pub prev_state: Option<i64>,
    /// `optional string next_comm = 5;`
    #[prost(string, optional, tag = "5")]
    pub next_comm: Option<String>,
    /// `optional int32 next_pid = 6;`
    #[prost(int32, optional, tag = "6")]
    pub next_pid: Option<i32>,
    /// `optional int32 next_prio = 7;`
    #[prost(int32, optional, tag = "7")]
    pub next_prio: Option<i32>,
}

/// `protos/perfetto/trace/ftrace/sched.proto`: `message SchedWakingFtraceEvent`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SchedWakingFtraceEvent {
    /// `optional string comm = 1;`
    #[prost(string, optional, tag = "1")]
    pub comm: Option<String>,
    /// `optional int32 pid = 2;` (the woken thread)
    #[prost(int32, optional, tag = "2")]
    pub pid: Option<i32>,
    /// `optional int32 prio = 3;`
    #[prost(int32, optional, tag = "3")]
    pub prio: Option<i32>,
    /// `optional int32 success = 4;`
    #[prost(int32, optional, tag = "4")]
    pub success: Option<i32>,
    /// `optional int32 target_cpu = 5;`
    #[prost(int32, optional, tag = "5")]
    pub target_cpu: Option<i32>,
}
