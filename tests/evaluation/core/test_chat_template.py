"""Chat templates: with ``--chat-template model`` a LongBench prompt is token-identical to what
LongBench's ``pred.py`` feeds a chat model (truncate the text in the middle, wrap it with the
chat rule, tokenize with special tokens), except for the six tasks pred.py leaves unwrapped;
``none`` warns when the tokenizer ships a template, ``model`` is refused without one."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from megatron_endprompt.cli import eval as eval_cli
from megatron_endprompt.evaluation.core import chat
from megatron_endprompt.evaluation.longbench import run as longbench
from megatron_endprompt.evaluation.longbench import spec as longbench_spec
from megatron_endprompt.evaluation.core import runner
from tests.evaluation.tiny_tokenizers import FIXTURES, build_tokenizer

FIX = os.path.join(FIXTURES, "longbench")
#: LongBench pred.py build_chat for "llama2": f"[INST]{prompt}[/INST]" (the tokenizer adds
#: BOS); a template that renders the same user turn.
LLAMA2_RULE = "{{ bos_token }}[INST]{{ messages[0]['content'] }}[/INST]"


@pytest.fixture(scope="module")
def chat_tok():
    tok = build_tokenizer("bytelevel")
    tok.chat_template = LLAMA2_RULE
    return tok


def _longbench_reference(tok, task, item, max_length):
    """pred.py for a llama2 chat model, step by step."""
    prompt = longbench_spec.prompt_template(task).format(**item)
    ids = tok(prompt)["input_ids"]
    if len(ids) > max_length:
        half = int(max_length / 2)
        prompt = (tok.decode(ids[:half], skip_special_tokens=True)
                  + tok.decode(ids[-half:], skip_special_tokens=True))
    if task not in ["trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p"]:
        prompt = f"[INST]{prompt}[/INST]"
    return tok(prompt)["input_ids"]


@pytest.mark.parametrize("task", longbench_spec.TASKS)
def test_longbench_chat_prompt_is_pred_py(chat_tok, task):
    item = longbench.load_task(FIX, task)[0]
    for max_length in (10_000, 40):  # untruncated, and cut in the middle
        got = longbench.build_prompt(task, item, chat_tok, max_length, chat=True)
        assert got == _longbench_reference(chat_tok, task, item, max_length), (task, max_length)
        plain = longbench.build_prompt(task, item, chat_tok, max_length)
        assert (got == plain) == (task in longbench_spec.NO_CHAT_TASKS)


def test_warning_and_refusal(chat_tok, tiny_model_dir, tmp_path, run_tool, monkeypatch):
    logged = []
    chat.check_setting("none", "m", chat_tok, logged.append)
    assert logged == [chat.warning("m")] and "--chat-template model" in logged[0]
    plain = build_tokenizer("bytelevel")
    logged.clear()
    chat.check_setting("none", "m", plain, logged.append)
    assert logged == []
    monkeypatch.setattr(runner, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    rc, _, err = run_tool(eval_cli.main, [
        "--hf-dir", tiny_model_dir, "--tasks", "niah_single_1", "--lengths", "1024",
        "--chat-template", "model", "--output", tmp_path / "r.json", "--no-progress"])
    assert rc == 2 and err.strip().splitlines() == [err.strip()] and "no chat template" in err
    assert not os.path.exists(tmp_path / "r.json")


def test_chat_template_recorded(tiny_model_dir, tmp_path, run_tool):
    """A chat model run without its template: the warning, and the JSON meta says so."""
    model_dir = tmp_path / "chat_model"
    shutil.copytree(tiny_model_dir, model_dir)
    tok = runner.load_tokenizer(str(model_dir))
    tok.chat_template = LLAMA2_RULE
    tok.save_pretrained(model_dir)
    lb = tmp_path / "lb"
    lb.mkdir()
    shutil.copy(os.path.join(FIX, "trec.jsonl"), lb)
    rc, _, err = run_tool(eval_cli.main, [
        "--hf-dir", model_dir, "--tasks", "none", "--lengths", "1024", "--longbench-dir", lb,
        "--bench-limit", "1", "--output", tmp_path / "r.json", "--no-progress"])
    assert rc == 0, err
    assert "ships a chat template" in err
    meta = json.loads((tmp_path / "r.json").read_text())["meta"]
    assert meta["chat_template"] == "none" and meta["tokenizer_chat_template"] is True


def test_chat_template_on_tasks_that_stay_base_says_so(tiny_model_dir, tmp_path, run_tool):
    """``--chat-template model`` with RULER / passkey tasks: those prompts stay base (RULER's
    base template). The run says so in one line, the JSON lists them and the markdown note names
    them, so an instruct model's table does not read as if every prompt had been wrapped (before,
    the flag did nothing for them without a word)."""
    model_dir = tmp_path / "chat_model"
    shutil.copytree(tiny_model_dir, model_dir)
    tok = runner.load_tokenizer(str(model_dir))
    tok.chat_template = LLAMA2_RULE
    tok.save_pretrained(model_dir)
    rc, _, err = run_tool(eval_cli.main, [
        "--hf-dir", model_dir, "--tasks", "niah_single_1,passkey", "--lengths", "512",
        "--samples", "1", "--num-depths", "1", "--chat-template", "model",
        "--output", tmp_path / "r.json", "--no-progress"])
    assert rc == 0, err
    notes = [line for line in err.splitlines() if "stay base" in line]
    assert notes == [chat.base_tasks_note(["niah_single_1", "passkey"])], err
    meta = json.loads((tmp_path / "r.json").read_text())["meta"]
    assert meta["chat_template_base_tasks"] == ["niah_single_1", "passkey"]
    md = (tmp_path / "r.md").read_text()
    assert "niah_single_1, passkey prompts stay base" in md
