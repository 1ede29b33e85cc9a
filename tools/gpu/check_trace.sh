#!/usr/bin/env bash
# What a GPU trace holds, through Perfetto's trace processor (tools/trace_processor.mjs; needs node and
# `cargo xtask setup-tools`):   tools/gpu/check_trace.sh TRACE
set -eu
T=${1:?usage: check_trace.sh TRACE}
TP="$(cd "$(dirname "$0")/.." && pwd)/trace_processor.mjs"
node "$TP" "$T" \
  "select name, idx, severity, value from stats where value > 0 and severity in ('error', 'data_loss')" \
  "select s.name, count(*) as n, round(sum(s.dur) / 1e6, 3) as total_ms, round(max(s.dur) / 1e6, 3) as max_ms from slice s where s.category = 'cuda-host' group by 1 order by n desc limit 30" \
  "select sum(extract_arg(arg_set_id, 'debug.launches')) as launches_in_batches from slice where category = 'cuda-host'" \
  "select t.name, count(*) as samples, round(avg(c.value), 1) as avg, round(max(c.value), 1) as max from counter c join counter_track t on c.track_id = t.id where t.name like 'GPU %' group by 1" \
  "select name from slice where name like 'CUDA driver probes%' or name like 'libcuda not loaded%' or name like 'GPU counters unavailable%'" \
  "select extract_arg(arg_set_id, 'debug.cuda') as cuda_probe, extract_arg(arg_set_id, 'debug.cuda_calls') as cuda_calls, extract_arg(arg_set_id, 'debug.total_dropped') as dropped from slice where name = 'llmprof summary'"
