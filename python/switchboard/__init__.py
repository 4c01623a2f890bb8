"""switchboard for Python: models by name, in-process, over libswitchboard.

A thin ctypes layer over the shared library's high-level API (the
"switchboard" section of include/switchboard.h); the standard library only.

    from switchboard import Switchboard
    with Switchboard("models.json", threads=4) as sb:
        print(sb.infer("Once upon a time", max_tokens=32, temperature=0).text)
        for piece in sb.stream("The little dog", max_tokens=32):
            print(piece, end="", flush=True)
        sb.switch_model("stories")          # the default model from now on
        print(sb.profile().ttft_s)          # the last call's profile

The library is found through $SWITCHBOARD_LIB (a path to libswitchboard.so),
else next to a build of this checkout (build/libswitchboard.so), else on the
system's library path. Calls release the GIL while the library works, so
several Python threads generating at once are batched by the engine.
"""

import ctypes
import ctypes.util
import dataclasses
import json
import os

__all__ = ["Switchboard", "SwitchboardError", "Result", "Profile", "load_library"]

# ---- the C structs (layouts of include/switchboard.h) --------------------------


class _Error(ctypes.Structure):
    _fields_ = [("status", ctypes.c_int), ("msg", ctypes.c_char * 512)]


class _SamplerParams(ctypes.Structure):
    _fields_ = [
        ("temperature", ctypes.c_float),
        ("top_k", ctypes.c_int32),
        ("top_p", ctypes.c_float),
        ("min_p", ctypes.c_float),
        ("repeat_penalty", ctypes.c_float),
        ("repeat_last_n", ctypes.c_int32),
        ("frequency_penalty", ctypes.c_float),
        ("presence_penalty", ctypes.c_float),
        ("seed", ctypes.c_uint64),
        ("logit_bias", ctypes.c_void_p),  # const sb_logit_bias *: not offered here yet
        ("n_logit_bias", ctypes.c_int32),
    ]


class _SwitchboardParams(ctypes.Structure):
    _fields_ = [
        ("n_threads", ctypes.c_int32),
        ("memory_budget", ctypes.c_size_t),
        ("model_name", ctypes.c_char_p),
        ("default_model", ctypes.c_char_p),
        ("n_ctx", ctypes.c_int32),
        ("n_parallel", ctypes.c_int32),
        ("cache_type", ctypes.c_int),
        ("keep_alive_s", ctypes.c_double),
        ("watch", ctypes.c_bool),
        ("max_batch_tokens", ctypes.c_int32),
        ("max_queue", ctypes.c_int32),
        ("log", ctypes.c_void_p),  # a C callback: not offered here
        ("log_user", ctypes.c_void_p),
    ]


class _Served(ctypes.Structure):
    _fields_ = [
        ("model", ctypes.c_char * 128),
        ("route", ctypes.c_char * 128),
        ("fallback", ctypes.c_bool),
        ("fallback_reason", ctypes.c_char * 256),
    ]


class _TokenLogprob(ctypes.Structure):
    _fields_ = [("token", ctypes.c_int32), ("logprob", ctypes.c_float)]


class _StreamEvent(ctypes.Structure):
    _fields_ = [
        ("index", ctypes.c_int32),
        ("done", ctypes.c_bool),
        ("token", ctypes.c_int32),
        ("text", ctypes.c_void_p),
        ("text_len", ctypes.c_size_t),
        ("logprob", ctypes.c_float),
        ("top", ctypes.POINTER(_TokenLogprob)),
        ("n_top", ctypes.c_int32),
        ("finish", ctypes.c_int),
        ("n_prompt", ctypes.c_int32),
        ("n_prompt_cached", ctypes.c_int32),
        ("n_generated", ctypes.c_int32),
        ("ttft_s", ctypes.c_double),
        ("error", ctypes.c_char_p),
        ("embedding", ctypes.POINTER(ctypes.c_float)),
        ("n_embd", ctypes.c_int32),
        ("time_s", ctypes.c_double),
    ]


_StreamFn = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.POINTER(_StreamEvent))


class _InferParams(ctypes.Structure):
    _fields_ = [
        ("model", ctypes.c_char_p),
        ("user", ctypes.c_char_p),
        ("sampling", ctypes.POINTER(_SamplerParams)),
        ("max_tokens", ctypes.c_int32),
        ("stops", ctypes.POINTER(ctypes.c_char_p)),
        ("n_stops", ctypes.c_size_t),
        ("logprobs", ctypes.c_bool),
        ("top_logprobs", ctypes.c_int32),
        ("ignore_eos", ctypes.c_bool),
        ("priority", ctypes.c_int32),
        ("keep_alive_s", ctypes.c_double),
        ("grammar", ctypes.c_void_p),  # const sb_grammar_t *: not offered here yet
        ("embedding", ctypes.c_bool),
        ("on_event", _StreamFn),
        ("user_data", ctypes.c_void_p),
    ]


class _Profile(ctypes.Structure):
    _fields_ = [
        ("load_s", ctypes.c_double),
        ("ttft_s", ctypes.c_double),
        ("total_s", ctypes.c_double),
        ("prompt_tps", ctypes.c_double),
        ("gen_tps", ctypes.c_double),
        ("n_prompt", ctypes.c_int32),
        ("n_prompt_cached", ctypes.c_int32),
        ("n_generated", ctypes.c_int32),
        ("rss_bytes", ctypes.c_size_t),
        ("peak_rss_bytes", ctypes.c_size_t),
        ("models_bytes", ctypes.c_size_t),
        ("budget_bytes", ctypes.c_size_t),
    ]


class _Result(ctypes.Structure):
    _fields_ = [
        ("text", ctypes.c_void_p),
        ("text_len", ctypes.c_size_t),
        ("finish", ctypes.c_int),
        ("n_prompt", ctypes.c_int32),
        ("n_prompt_cached", ctypes.c_int32),
        ("n_generated", ctypes.c_int32),
        ("served", _Served),
        ("profile", _Profile),
    ]


class _Input(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_int),
        ("text", ctypes.c_char_p),
        ("messages", ctypes.c_void_p),
        ("n_messages", ctypes.c_size_t),
        ("tokens", ctypes.c_void_p),  # const int32_t *: not offered here yet
        ("n_tokens", ctypes.c_size_t),
        ("seed_offset", ctypes.c_uint64),
    ]


_INPUT_TEXT, _INPUT_CHAT_JSON = 0, 1
_KEEP_ALIVE_UNCHANGED = -2.0
_FINISH = {0: None, 1: "stop", 2: "length", 3: "cancelled", 4: "error"}

# ---- the library ---------------------------------------------------------------


def _candidates():
    env = os.environ.get("SWITCHBOARD_LIB")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "..", "..", "build", "libswitchboard.so")
    found = ctypes.util.find_library("switchboard")
    if found:
        yield found


_lib = None


def load_library():
    """The shared library, loaded once (see the module's docstring for where from)."""
    global _lib
    if _lib is not None:
        return _lib
    tried = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
            break
        except OSError as e:
            tried.append(f"{path}: {e}")
    else:
        raise OSError("libswitchboard not found; set SWITCHBOARD_LIB to its path (tried: "
                      + ("; ".join(tried) or "nothing") + ")")
    P = ctypes.POINTER
    sigs = {
        "sb_status_str": (ctypes.c_char_p, [ctypes.c_int]),
        "sb_sampler_default_params": (_SamplerParams, []),
        "sb_switchboard_default_params": (_SwitchboardParams, []),
        "sb_switchboard_open": (ctypes.c_int, [ctypes.c_char_p, P(_SwitchboardParams), P(ctypes.c_void_p), P(_Error)]),
        "sb_switchboard_free": (None, [ctypes.c_void_p]),
        "sb_switchboard_reload": (ctypes.c_int, [ctypes.c_void_p, P(_Error)]),
        "sb_switchboard_models": (ctypes.c_int32, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]),
        "sb_switchboard_set_default": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, P(_Served), P(_Error)]),
        "sb_switchboard_get_default": (None, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]),
        "sb_infer_default_params": (_InferParams, []),
        "sb_result_free": (None, [P(_Result)]),
        "sb_switchboard_complete": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, P(_InferParams), P(_Result), P(_Error)]),
        "sb_switchboard_chat": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, P(_InferParams), P(_Result), P(_Error)]),
        "sb_switchboard_batch_infer": (ctypes.c_int, [ctypes.c_void_p, P(ctypes.c_char_p), ctypes.c_size_t,
                                                      P(_InferParams), P(_Result), P(_Profile), P(_Error)]),
        "sb_switchboard_last_profile": (None, [ctypes.c_void_p, P(_Profile)]),
        "sb_switchboard_submit": (ctypes.c_int, [ctypes.c_void_p, P(_Input), ctypes.c_size_t, P(_InferParams),
                                                 P(ctypes.c_void_p), P(_Error)]),
        "sb_request_next": (ctypes.c_bool, [ctypes.c_void_p, ctypes.c_int64, P(_StreamEvent)]),
        "sb_request_finished": (ctypes.c_bool, [ctypes.c_void_p]),
        "sb_request_served": (None, [ctypes.c_void_p, P(_Served)]),
        "sb_request_free": (None, [ctypes.c_void_p]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    _lib = lib
    return lib


# ---- what calls return ---------------------------------------------------------


class SwitchboardError(Exception):
    """A call failed: `status` is the library's code (negative), `status_name`
    its text ("no such model", ...), `message` what was wrong and where."""

    def __init__(self, status, message):
        self.status = status
        self.status_name = load_library().sb_status_str(status).decode()
        self.message = message
        super().__init__(f"{message} ({self.status_name})")


@dataclasses.dataclass
class Profile:
    """What a call cost; see sb_profile in switchboard.h."""
    load_s: float
    ttft_s: float
    total_s: float
    prompt_tps: float
    gen_tps: float
    n_prompt: int
    n_prompt_cached: int
    n_generated: int
    rss_bytes: int
    peak_rss_bytes: int
    models_bytes: int
    budget_bytes: int

    @classmethod
    def _of(cls, p):
        return cls(**{f.name: getattr(p, f.name) for f in dataclasses.fields(cls)})


@dataclasses.dataclass
class Result:
    """A generation: its text, why it ended, usage, and who served it."""
    text: str
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    model: str
    fallback: bool
    fallback_reason: str
    profile: Profile

    def __str__(self):
        return self.text

    @classmethod
    def _of(cls, r):
        text = ctypes.string_at(r.text, r.text_len).decode("utf-8", "replace") if r.text else ""
        return cls(text=text, finish_reason=_FINISH.get(r.finish), prompt_tokens=r.n_prompt,
                   cached_tokens=r.n_prompt_cached, completion_tokens=r.n_generated,
                   model=r.served.model.decode(), fallback=bool(r.served.fallback),
                   fallback_reason=r.served.fallback_reason.decode(), profile=Profile._of(r.profile))


_SAMPLING = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n",
             "frequency_penalty", "presence_penalty", "seed")


class _Params:
    """sb_infer_params from keyword arguments, keeping alive what it points to."""

    def __init__(self, lib, model, kw):
        p = lib.sb_infer_default_params()
        p.model = model.encode() if model is not None else None
        if kw.get("user") is not None:
            p.user = kw.pop("user").encode()
        kw.pop("user", None)
        sampling = {k: kw.pop(k) for k in _SAMPLING if k in kw}
        self.sampling = None
        if sampling:  # the fields not given: sb_sampler_default_params()
            self.sampling = lib.sb_sampler_default_params()
            for k, v in sampling.items():
                setattr(self.sampling, k, v)
            p.sampling = ctypes.pointer(self.sampling)
        stop = kw.pop("stop", None)
        if stop is not None:
            stops = [stop] if isinstance(stop, str) else list(stop)
            self.stops = (ctypes.c_char_p * len(stops))(*[s.encode() for s in stops])
            p.stops, p.n_stops = self.stops, len(stops)
        for k in ("max_tokens", "logprobs", "top_logprobs", "ignore_eos", "priority"):
            if k in kw:
                setattr(p, k, kw.pop(k))
        keep_alive = kw.pop("keep_alive", None)
        p.keep_alive_s = _KEEP_ALIVE_UNCHANGED if keep_alive is None else float(keep_alive)
        if kw:
            raise TypeError(f"unknown parameter(s): {', '.join(sorted(kw))}")
        self.p = p


class Switchboard:
    """An open registry (models.json, a directory of .gguf files, or one
    .gguf file). Keyword arguments: threads, memory_budget (bytes),
    model_name (the name a single file serves under), default_model, n_ctx,
    parallel, keep_alive (seconds; None or < 0: forever), watch.

    Generation calls take the model's name (None: the default model) and
    parameters: temperature, top_k, top_p, min_p, repeat_penalty,
    repeat_last_n, frequency_penalty, presence_penalty, seed (any of these:
    sampling from the library's defaults, none: the registry's defaults for
    the model), max_tokens, stop (a string or a list), ignore_eos,
    priority, keep_alive, user (the A/B arm's key)."""

    def __init__(self, path, *, threads=0, memory_budget=0, model_name=None, default_model=None,
                 n_ctx=0, parallel=0, keep_alive=None, watch=False):
        self._lib = lib = load_library()
        self._h = None
        self._streams = set()  # requests of streams not yet closed
        p = lib.sb_switchboard_default_params()
        p.n_threads, p.memory_budget, p.n_ctx, p.n_parallel = threads, memory_budget, n_ctx, parallel
        p.model_name = model_name.encode() if model_name else None
        p.default_model = default_model.encode() if default_model else None
        p.keep_alive_s = -1.0 if keep_alive is None else float(keep_alive)
        p.watch = watch
        h = ctypes.c_void_p()
        self._call(lib.sb_switchboard_open, os.fsencode(path), ctypes.byref(p), ctypes.byref(h))
        self._h = h

    def _call(self, fn, *args):
        """fn(*args, &err), raising SwitchboardError when it fails."""
        err = _Error()
        status = fn(*args, ctypes.byref(err))
        if status != 0:
            raise SwitchboardError(status, err.msg.decode("utf-8", "replace"))

    def _handle(self):
        if self._h is None:
            raise ValueError("this Switchboard is closed")
        return self._h

    def close(self):
        """Frees the registry; streams still open are cancelled first."""
        for req in list(self._streams):
            self._lib.sb_request_free(ctypes.c_void_p(req))
        self._streams.clear()
        if self._h is not None:
            self._lib.sb_switchboard_free(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    # ---- models ----

    def models(self):
        """Every name a call may use: models, aliases, routes."""
        cap = 1 << 16
        buf = ctypes.create_string_buffer(cap)
        n = self._lib.sb_switchboard_models(self._handle(), buf, cap)
        return [s.decode() for s in buf.raw.split(b"\0")[:n]]

    def switch_model(self, name):
        """Makes `name` the default model (loading it). Returns the name of the
        model that serves it: the fallback's when the registry has one and
        does not know `name`; otherwise an unknown name raises
        SwitchboardError (status SB_ERR_MODEL_NOT_FOUND)."""
        served = _Served()
        self._call(self._lib.sb_switchboard_set_default, self._handle(), name.encode(), ctypes.byref(served))
        return served.model.decode()

    @property
    def default_model(self):
        buf = ctypes.create_string_buffer(128)
        self._lib.sb_switchboard_get_default(self._handle(), buf, 128)
        return buf.value.decode()

    def reload(self):
        self._call(self._lib.sb_switchboard_reload, self._handle())

    # ---- generation ----

    def _blocking(self, fn, arg, model, kw):
        params = _Params(self._lib, model, kw)
        res = _Result()
        self._call(fn, self._handle(), arg, ctypes.byref(params.p), ctypes.byref(res))
        try:
            return Result._of(res)
        finally:
            self._lib.sb_result_free(ctypes.byref(res))

    def infer(self, prompt, model=None, **params):
        """Completes a text prompt; returns a Result (str(result) is the text)."""
        return self._blocking(self._lib.sb_switchboard_complete, prompt.encode(), model, params)

    def chat(self, messages, model=None, **params):
        """Answers chat messages ([{"role": ..., "content": ...}, ...]) through
        the model's chat template; returns a Result."""
        return self._blocking(self._lib.sb_switchboard_chat, json.dumps(messages).encode(), model, params)

    def stream(self, prompt=None, model=None, *, messages=None, **params):
        """Yields the text as it is generated, piece by piece, from a prompt or
        chat messages. The generation starts at the first next(); closing
        the generator early cancels it."""
        if (prompt is None) == (messages is None):
            raise TypeError("stream() takes a prompt or messages, not both")
        if prompt is not None:
            inp = _Input(kind=_INPUT_TEXT, text=prompt.encode())
        else:
            inp = _Input(kind=_INPUT_CHAT_JSON, text=json.dumps(messages).encode())
        p = _Params(self._lib, model, params)
        return self._pieces(inp, p)

    def _pieces(self, inp, p):
        req = ctypes.c_void_p()
        self._call(self._lib.sb_switchboard_submit, self._handle(), ctypes.byref(inp), 1, ctypes.byref(p.p),
                   ctypes.byref(req))
        self._streams.add(req.value)
        ev = _StreamEvent()
        try:
            while True:
                # a short timeout, so that Ctrl-C reaches Python between waits
                if not self._lib.sb_request_next(req, 100, ctypes.byref(ev)):
                    if self._lib.sb_request_finished(req):
                        return
                    continue
                if ev.done and ev.finish == 4:  # SB_FINISHED_ERROR: the engine ran out of memory
                    raise SwitchboardError(-2, (ev.error or b"generation failed").decode())
                if ev.text_len:  # the engine sends whole UTF-8 characters
                    yield ctypes.string_at(ev.text, ev.text_len).decode("utf-8", "replace")
        finally:
            if req.value in self._streams:  # else close() freed it
                self._streams.discard(req.value)
                self._lib.sb_request_free(req)

    def batch_infer(self, prompts, model=None, **params):
        """Runs the prompts together on one model (batched by its engine);
        returns their Results in order."""
        prompts = list(prompts)
        if not prompts:
            return []
        p = _Params(self._lib, model, params)
        arr = (ctypes.c_char_p * len(prompts))(*[s.encode() for s in prompts])
        results = (_Result * len(prompts))()
        self._call(self._lib.sb_switchboard_batch_infer, self._handle(), arr, len(prompts), ctypes.byref(p.p),
                   results, None)
        try:
            return [Result._of(r) for r in results]
        finally:
            for r in results:
                self._lib.sb_result_free(ctypes.byref(r))

    def profile(self):
        """The profile of the last call that finished (infer, chat, stream,
        batch_infer, switch_model)."""
        p = _Profile()
        self._lib.sb_switchboard_last_profile(self._handle(), ctypes.byref(p))
        return Profile._of(p)
