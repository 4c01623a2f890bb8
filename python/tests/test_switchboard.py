"""The Python module over libswitchboard: the same calls as the C API."""

import threading

import pytest

from switchboard import Profile, Result, Switchboard, SwitchboardError

GREEDY = dict(temperature=0, max_tokens=16)


@pytest.fixture
def sb(model):
    with Switchboard(str(model), threads=2) as s:
        yield s


def test_infer(sb):
    r = sb.infer("Once upon a time", **GREEDY)
    assert isinstance(r, Result)
    assert r.model == "demo" and not r.fallback
    assert r.completion_tokens == 16 and r.finish_reason == "length"
    assert r.prompt_tokens > 0 and str(r) == r.text and r.text
    assert sb.infer("Once upon a time", **GREEDY).text == r.text  # greedy: the same again


def test_stream_pieces_make_the_text(sb):
    whole = sb.infer("Once upon a time", **GREEDY).text
    pieces = list(sb.stream("Once upon a time", **GREEDY))
    assert len(pieces) > 1 and "".join(pieces) == whole
    assert sb.profile().n_generated == 16


def test_stream_closed_early_cancels(sb):
    gen = sb.stream("Once upon a time", temperature=0, max_tokens=200, ignore_eos=True)
    next(gen)
    gen.close()
    # the handle still works, and closing with a stream open is safe too
    dangling = sb.stream("Once upon a time", **GREEDY)
    next(dangling)
    sb.close()


def test_stop(sb):
    whole = sb.infer("Once upon a time", temperature=0, max_tokens=30, ignore_eos=True).text
    stop = whole[len(whole) // 2:len(whole) // 2 + 3]
    r = sb.infer("Once upon a time", temperature=0, max_tokens=30, ignore_eos=True, stop=[stop])
    assert r.finish_reason == "stop" and r.text == whole[:whole.index(stop)]


def test_chat(sb):
    msgs = [{"role": "user", "content": "Hello"}]
    r = sb.chat(msgs, **GREEDY)
    assert r.completion_tokens > 0
    assert "".join(sb.stream(messages=msgs, **GREEDY)) == r.text
    with pytest.raises(SwitchboardError) as e:
        sb.chat([], **GREEDY)
    assert e.value.status == -5 and "no messages" in e.value.message


def test_batch_matches_single(sb):
    prompts = ["Once upon a time", "The dog", "One day, Lily", "Hi"]
    batch = sb.batch_infer(prompts, **GREEDY)
    assert [r.text for r in batch] == [sb.infer(p, **GREEDY).text for p in prompts]
    assert sb.batch_infer([]) == []


def test_threads_batch_together(sb):
    want = sb.infer("Once upon a time", **GREEDY).text
    got = []
    threads = [threading.Thread(target=lambda: got.append(sb.infer("Once upon a time", **GREEDY).text))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [want] * 4


def test_switch_model_and_fallback(registry):
    with Switchboard(str(registry)) as sb:
        assert sb.default_model == "demo"
        assert set(sb.models()) == {"demo", "other", "alt"}
        assert sb.switch_model("alt") == "other"
        assert sb.infer("Once upon a time", max_tokens=4).model == "other"
        assert sb.switch_model("no-such-model") == "demo"  # the fallback serves it
        r = sb.infer("Once upon a time", max_tokens=4)
        assert r.fallback and r.model == "demo" and "no-such-model" in r.fallback_reason
        assert sb.infer("x", model="other", max_tokens=2).model == "other"


def test_errors(model, sb):
    with pytest.raises(SwitchboardError) as e:
        sb.switch_model("nope")  # one file: no fallback
    assert e.value.status == -9 and e.value.status_name == "no such model" and "demo" in e.value.message
    with pytest.raises(SwitchboardError) as e:
        sb.infer("x", model="nope")
    assert e.value.status == -9
    with pytest.raises(SwitchboardError) as e:
        Switchboard("/nonexistent/models.json")
    assert "/nonexistent/models.json" in e.value.message
    with pytest.raises(SwitchboardError) as e:
        Switchboard(str(model), memory_budget=4096).infer("x")
    assert e.value.status == -10
    with pytest.raises(TypeError):
        sb.infer("x", temprature=0)


def test_profile(sb):
    sb.infer("Once upon a time", temperature=0, max_tokens=8, ignore_eos=True)
    p = sb.profile()
    assert isinstance(p, Profile)
    assert p.n_generated == 8 and p.n_prompt > 0
    assert p.ttft_s > 0 and p.total_s >= p.ttft_s and p.gen_tps > 0
    assert p.peak_rss_bytes >= p.rss_bytes > 0 and p.models_bytes > 0
    sb.switch_model("demo")
    assert sb.profile().n_generated == 0  # switch_model is a call of its own
