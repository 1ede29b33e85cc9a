# llmprof's Python hooks, run inside the traced interpreter by libllmprof_pyhooks (see its lib.rs), as the
# module `_llmprof_hooks`.
#
# Installs wrappers that hand engine-probe records to the helper library through ctypes, and removes them:
# every attribute replaced is kept with its original object, put back at removal and checked to be that
# object again. Never raises into the target: the hooked functions run untouched (their own exceptions go to
# their callers), and every exception of this code is caught, counted (llmprof_py_hook_error) and reported.
#
# What it hooks:
# - presets, chosen from what the interpreter has imported: vLLM V1's scheduler (engine steps with their
#   batch, request lifecycles, preemptions, KV-cache blocks);
# - `--py-range MODULE:QUALNAME`: a range (push at the call, pop at its return or exception) around any
#   function or method of a module the interpreter has imported.

import ctypes
import functools
import inspect
import json
import sys
import time

_INSTALLED = 2
_FAILED = 3
_REMOVED = 5

_CLOCK = getattr(time, "CLOCK_BOOTTIME", 7)

# llmprof_abi's values.
_STEP_PREFILL, _STEP_DECODE, _STEP_MIXED = 0, 1, 2
_ARRIVED, _SCHEDULED, _FIRST_TOKEN, _PREEMPTED, _FINISHED = 0, 1, 2, 3, 4
_FINISH_NONE, _FINISH_STOP, _FINISH_LENGTH, _FINISH_ABORT, _FINISH_ERROR = 0, 1, 2, 3, 4
_PUSH, _POP = 0, 1
# An op the library ignores (no record, no probe): what calibration calls.
_IGNORED = 255
_RANGE_DOMAIN_LEN, _RANGE_NAME_LEN = 16, 48
_MAX_STEP_REQS = 64


def _now():
    return time.clock_gettime_ns(_CLOCK)


# What the hooks cost the target's threads, measured: the CPU time of the hooks' own Python work (`_spent`,
# handed to the library with the next record and zeroed) — the thread's CPU clock, so a wait for the
# interpreter's lock or a preemption in the middle does not count — apart from the time inside the record
# calls (`_calls`, by the cheap wall clock: their ctypes transition is charged at the calibrated figure, the
# probe hit by llmprof's own counters).
_spent = 0
_calls = 0
_cpu = time.thread_time_ns


def _take():
    global _spent
    s, _spent = _spent, 0
    return max(0, s)


def _mark():
    """Where a hook's own work starts: (event time, thread CPU time, time in record calls so far)."""
    return _now(), _cpu(), _calls


def _done(mark):
    """A hook's own work since `mark` ends: it counts, the record calls inside it apart."""
    global _spent
    _, c0, r0 = mark
    _spent += (_cpu() - c0) - (_calls - r0)


def _record(f, *args):
    """One record call (the library's step, request or range function), timed apart."""
    global _calls
    t = _now()
    f(*args, _take())
    _calls += _now() - t


class _StepArgs(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_uint64)
        for n in (
            "step_id",
            "kind",
            "host_start_ns",
            "host_end_ns",
            "num_seqs",
            "prefill_tokens",
            "decode_tokens",
            "kv_blocks_used",
            "kv_blocks_total",
            "num_waiting",
            "num_preempted",
        )
    ]


class _RequestArgs(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_uint64),
        ("req_id", ctypes.c_uint64),
        ("ts_ns", ctypes.c_uint64),
        ("prompt_tokens", ctypes.c_uint64),
        ("output_tokens", ctypes.c_uint64),
        ("max_tokens", ctypes.c_uint64),
        ("temperature", ctypes.c_double),
        ("top_p", ctypes.c_double),
        ("num_preemptions", ctypes.c_uint64),
        ("finish_reason", ctypes.c_uint64),
    ]


class _Lib:
    """The helper library's functions the hooks call."""

    def __init__(self, path):
        lib = ctypes.CDLL(path)
        u32, u64, size, p = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_char_p
        self.report = lib.llmprof_py_report
        self.report.argtypes = [u32, u32, u64, p, size]
        self.report.restype = None
        self.hook_error = lib.llmprof_py_hook_error
        self.hook_error.argtypes = []
        self.hook_error.restype = None
        self.step = lib.llmprof_py_step
        self.step.argtypes = [ctypes.POINTER(_StepArgs), ctypes.POINTER(u64), ctypes.POINTER(u32), size, u64]
        self.step.restype = None
        self.request = lib.llmprof_py_request
        self.request.argtypes = [ctypes.POINTER(_RequestArgs), p, size, p, size, u64]
        self.request.restype = None
        self.range = lib.llmprof_py_range
        self.range.argtypes = [u32, u64, u64, p, size, p, size, u64]
        self.range.restype = None


_lib = None
# (owner, name, had_own_attribute, original __dict__ entry)
_installed = []


def _error():
    try:
        _lib.hook_error()
    except BaseException:
        pass


def _replace(owner, name, make_wrapper):
    """Puts make_wrapper(function) in place of owner.name (a function, a method, a static or class method)."""
    own = vars(owner)
    had_own = name in own
    entry = own[name] if had_own else inspect.getattr_static(owner, name)
    if isinstance(entry, (staticmethod, classmethod)):
        wrapped = type(entry)(make_wrapper(entry.__func__))
    elif inspect.isfunction(entry):
        wrapped = make_wrapper(entry)
    else:
        raise TypeError(f"{name} is a {type(entry).__name__}, not a Python function")
    setattr(owner, name, wrapped)
    _installed.append((owner, name, had_own, entry))


def _remove_all():
    """Puts every original back (last replaced first); the number of attributes not found as left."""
    lost = 0
    while _installed:
        owner, name, had_own, entry = _installed.pop()
        try:
            if had_own:
                setattr(owner, name, entry)
                ok = vars(owner).get(name) is entry
            else:
                delattr(owner, name)
                ok = name not in vars(owner)
            lost += 0 if ok else 1
        except BaseException:
            lost += 1
    return lost


# --- --py-range -----------------------------------------------------------------------------------------------


def _range_wrapper(domain, name):
    d = domain.encode()[-_RANGE_DOMAIN_LEN + 1 :]
    n = name.encode()[-_RANGE_NAME_LEN + 1 :]

    def make(fn):
        if inspect.iscoroutinefunction(fn) or inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            raise TypeError(
                "it is a coroutine or generator function: its calls interleave on one thread, a range cannot "
                "follow them"
            )

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            m = _mark()
            try:
                _record(_lib.range, _PUSH, m[0], 0, d, len(d), n, len(n))
            except BaseException:
                _error()
            _done(m)
            try:
                return fn(*args, **kwargs)
            finally:
                m = _mark()
                try:
                    _record(_lib.range, _POP, m[0], 0, d, len(d), n, len(n))
                except BaseException:
                    _error()
                _done(m)

        return wrapper

    return make


def _install_range(spec):
    module_name, sep, qualname = spec.partition(":")
    if not sep or not module_name or not qualname:
        raise ValueError("expected MODULE:QUALNAME")
    module = sys.modules.get(module_name)
    if module is None:
        raise LookupError(f"module {module_name} is not imported by this process")
    owner = module
    parts = qualname.split(".")
    for p in parts[:-1]:
        owner = getattr(owner, p)
    _replace(owner, parts[-1], _range_wrapper(module_name, qualname))


# --- vLLM -----------------------------------------------------------------------------------------------------

_VLLM_NEEDS = ("schedule", "update_from_output", "add_request", "_free_request")


class _Vllm:
    """vLLM V1's scheduler (vllm/v1/core/sched/scheduler.py): a step runs from `schedule()` to the end of
    `update_from_output()`; `add_request` is a request's arrival in the engine, `_free_request` its end,
    `_preempt_request` a preemption."""

    def __init__(self, scheduler_cls, version):
        self.version = version
        self.cls = scheduler_cls
        self.ids = {}
        self.next_id = 1
        self.scheduled = set()
        self.first = set()
        self.step_id = 0
        self.pending = None
        self.model = b""

    def rid(self, request_id):
        n = self.ids.get(request_id)
        if n is None:
            n = self.next_id
            self.next_id += 1
            self.ids[request_id] = n
        return n

    @staticmethod
    def xid(request_id):
        """The client's X-Request-Id in vLLM's engine request id: `chatcmpl-{xid}-{8 hex}` (or `cmpl-`)."""
        base, dash, tail = request_id.rpartition("-")
        if dash and len(tail) == 8 and all(c in "0123456789abcdef" for c in tail):
            request_id = base
        for prefix in ("chatcmpl-", "cmpl-"):
            if request_id.startswith(prefix):
                return request_id[len(prefix) :]
        return request_id

    def request(self, kind, request, ts, finish=_FINISH_NONE):
        sp = getattr(request, "sampling_params", None)
        a = _RequestArgs(
            kind=kind,
            req_id=self.rid(request.request_id),
            ts_ns=ts,
            prompt_tokens=int(getattr(request, "num_prompt_tokens", 0) or 0),
            output_tokens=int(getattr(request, "num_output_tokens", 0) or 0),
            max_tokens=int(getattr(request, "max_tokens", 0) or 0),
            temperature=float(getattr(sp, "temperature", 0.0) or 0.0),
            top_p=float(getattr(sp, "top_p", 1.0) or 0.0),
            num_preemptions=int(getattr(request, "num_preemptions", 0) or 0),
            finish_reason=finish,
        )
        x = self.xid(request.request_id).encode()
        _record(_lib.request, ctypes.byref(a), x, len(x), self.model, len(self.model))

    def first_token(self, request, ts):
        rid = request.request_id
        if rid not in self.first and int(getattr(request, "num_output_tokens", 0) or 0) >= 1:
            self.first.add(rid)
            self.request(_FIRST_TOKEN, request, ts)

    def finish_reason(self, request):
        status = getattr(getattr(request, "status", None), "name", "")
        return {
            "FINISHED_STOPPED": _FINISH_STOP,
            "FINISHED_LENGTH_CAPPED": _FINISH_LENGTH,
            "FINISHED_ABORTED": _FINISH_ABORT,
        }.get(status, _FINISH_ERROR if status.startswith("FINISHED") else _FINISH_NONE)

    def forget(self, request_id):
        self.ids.pop(request_id, None)
        self.scheduled.discard(request_id)
        self.first.discard(request_id)

    def install(self):
        vllm = self

        def add_request(fn):
            @functools.wraps(fn)
            def wrapper(self, request, *args, **kwargs):
                out = fn(self, request, *args, **kwargs)
                m = _mark()
                try:
                    if not vllm.model:
                        vllm.model = _served_name(self)
                    vllm.request(_ARRIVED, request, m[0])
                except BaseException:
                    _error()
                _done(m)
                return out

            return wrapper

        def schedule(fn):
            @functools.wraps(fn)
            def wrapper(self, *args, **kwargs):
                t0 = _now()
                out = fn(self, *args, **kwargs)
                m = _mark()
                try:
                    vllm.scheduled_step(self, out, t0)
                except BaseException:
                    vllm.pending = None
                    _error()
                _done(m)
                return out

            return wrapper

        def update_from_output(fn):
            @functools.wraps(fn)
            def wrapper(self, *args, **kwargs):
                out = fn(self, *args, **kwargs)
                m = _mark()
                try:
                    vllm.step_done(self, m[0])
                except BaseException:
                    _error()
                _done(m)
                return out

            return wrapper

        def free_request(fn):
            @functools.wraps(fn)
            def wrapper(self, request, *args, **kwargs):
                m = _mark()
                try:
                    vllm.first_token(request, m[0])
                    vllm.request(_FINISHED, request, m[0], vllm.finish_reason(request))
                    vllm.forget(request.request_id)
                except BaseException:
                    _error()
                _done(m)
                return fn(self, request, *args, **kwargs)

            return wrapper

        def preempt(fn):
            @functools.wraps(fn)
            def wrapper(self, request, *args, **kwargs):
                out = fn(self, request, *args, **kwargs)
                m = _mark()
                try:
                    vllm.request(_PREEMPTED, request, m[0])
                    if vllm.pending is not None:
                        vllm.pending["preempted"] += 1
                except BaseException:
                    _error()
                _done(m)
                return out

            return wrapper

        _replace(self.cls, "add_request", add_request)
        _replace(self.cls, "schedule", schedule)
        _replace(self.cls, "update_from_output", update_from_output)
        _replace(self.cls, "_free_request", free_request)
        hooks = ["add_request", "schedule", "update_from_output", "_free_request"]
        if inspect.isfunction(inspect.getattr_static(self.cls, "_preempt_request", None)):
            _replace(self.cls, "_preempt_request", preempt)
            hooks.append("_preempt_request")
        return hooks

    def scheduled_step(self, sched, out, t0):
        tokens = getattr(out, "num_scheduled_tokens", None) or {}
        if not tokens:
            self.pending = None
            return
        ts = _now()
        requests = getattr(sched, "requests", {})
        prefill = decode = 0
        ids, toks = [], []
        for rid, n in tokens.items():
            n = int(n)
            r = requests.get(rid)
            if r is not None:
                # `schedule()` has already added this step's tokens to num_computed_tokens.
                before = int(r.num_computed_tokens) - n
                p = max(0, min(n, int(r.num_prompt_tokens) - before))
                prefill += p
                decode += n - p
                if rid not in self.scheduled:
                    self.scheduled.add(rid)
                    self.request(_SCHEDULED, r, ts)
            else:
                decode += n
            if len(ids) < _MAX_STEP_REQS:
                ids.append(self.rid(rid))
                toks.append(n)
        self.pending = {
            "t0": t0,
            "ids": ids,
            "toks": toks,
            "num_seqs": len(tokens),
            "prefill": prefill,
            "decode": decode,
            "waiting": len(getattr(sched, "waiting", ()) or ()),
            "preempted": len(getattr(out, "preempted_req_ids", None) or ()),
            "rids": list(tokens),
        }

    def step_done(self, sched, t1):
        p, self.pending = self.pending, None
        if p is None:
            return
        requests = getattr(sched, "requests", {})
        for rid in p["rids"]:
            r = requests.get(rid)
            if r is not None:
                self.first_token(r, t1)
        used = total = 0
        try:
            pool = sched.kv_cache_manager.block_pool
            total = int(pool.num_gpu_blocks)
            used = total - int(pool.get_num_free_blocks())
        except BaseException:
            pass
        self.step_id += 1
        kind = (
            _STEP_MIXED
            if p["prefill"] and p["decode"]
            else (_STEP_PREFILL if p["prefill"] else _STEP_DECODE)
        )
        a = _StepArgs(
            step_id=self.step_id,
            kind=kind,
            host_start_ns=p["t0"],
            host_end_ns=t1,
            num_seqs=p["num_seqs"],
            prefill_tokens=p["prefill"],
            decode_tokens=p["decode"],
            kv_blocks_used=max(used, 0),
            kv_blocks_total=total,
            num_waiting=p["waiting"],
            num_preempted=p["preempted"],
        )
        n = len(p["ids"])
        ids = (ctypes.c_uint64 * n)(*p["ids"])
        toks = (ctypes.c_uint32 * n)(*p["toks"])
        _record(_lib.step, ctypes.byref(a), ids, toks, n)


def _served_name(sched):
    try:
        name = sched.vllm_config.model_config.served_model_name
    except BaseException:
        return b""
    if isinstance(name, (list, tuple)):
        name = name[0] if name else ""
    return str(name or "").encode()


def _install_vllm():
    """The vLLM preset, when this interpreter runs vLLM's V1 scheduler: the hooks installed, or None when
    vLLM's scheduler is not imported here (another process of the server)."""
    mod = sys.modules.get("vllm.v1.core.sched.scheduler")
    if mod is None:
        return None
    version = getattr(sys.modules.get("vllm"), "__version__", "unknown")
    cls = getattr(mod, "Scheduler", None)
    missing = [n for n in _VLLM_NEEDS if cls is None or not inspect.isfunction(inspect.getattr_static(cls, n, None))]
    if missing:
        raise LookupError(
            f"vLLM {version}: vllm.v1.core.sched.scheduler.Scheduler has no {', '.join(missing)}; the hooks "
            f"expect vLLM V1's Scheduler with {', '.join(_VLLM_NEEDS)} (as in vLLM 0.10 to 0.16)"
        )
    return f"vLLM {version}", _Vllm(cls, version).install()


# --- entry ----------------------------------------------------------------------------------------------------


def _calibrate(rounds=5, calls=2000):
    """ns one record call costs its thread, the probe hit aside (llmprof charges that from its own counters):
    the library's range function called with an op it ignores (no record, no probe), against an empty loop;
    the least of a few rounds (what the call costs, not the interruptions)."""
    d = b"llmprof"
    f = _lib.range
    best = None
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            pass
        t1 = time.perf_counter_ns()
        for _ in range(calls):
            f(_IGNORED, 0, 0, d, 7, d, 7, 0)
        t2 = time.perf_counter_ns()
        per_call = max(0, (t2 - t1) - (t1 - t0)) / calls
        best = per_call if best is None else min(best, per_call)
    return max(1, int(best))


def _install(config):
    """Installs what `config` asks for; (hooks installed, message parts)."""
    said = []
    if config.get("presets", True):
        try:
            got = _install_vllm()
            if got is not None:
                what, hooks = got
                said.append(f"{what}: {', '.join(hooks)}")
        except BaseException as e:
            said.append(f"{type(e).__name__}: {e}")
    for spec in config.get("ranges", []):
        try:
            _install_range(spec)
            said.append(f"range {spec}")
        except BaseException as e:
            said.append(f"range {spec}: not hooked: {e}")
    return len(_installed), said


def _llmprof_entry(lib_path, config_json, action):
    global _lib
    if _lib is None:
        _lib = _Lib(lib_path)
    try:
        if action == "remove":
            lost = _remove_all()
            msg = "every hook removed" if lost == 0 else f"{lost} hooks could not be put back"
            _lib.report(_REMOVED if lost == 0 else _FAILED, 0, 0, msg.encode(), len(msg.encode()))
            return
        # A session that ended without removing its hooks (llmprof killed) left them: start from the originals.
        _remove_all()
        config = json.loads(config_json) if config_json else {}
        n, said = _install(config)
        call_ns = _calibrate() if n else 0
        msg = "; ".join(said) if said else "nothing to hook in this process"
        b = msg.encode()
        _lib.report(_INSTALLED, n, call_ns, b, len(b))
    except BaseException as e:
        msg = f"{type(e).__name__}: {e}".encode()
        try:
            _lib.report(_FAILED, len(_installed), 0, msg, len(msg))
        except BaseException:
            pass
