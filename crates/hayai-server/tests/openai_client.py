#!/usr/bin/env python3
"""Exercise a hayai server (or any OpenAI-compatible server) with the official `openai` client.

Usage: openai_client.py BASE_URL   (e.g. http://127.0.0.1:8011/v1)

Checks response shapes and self-consistency (streaming equals non-streaming at temperature 0,
text and token-id prompts agree, prompt_logprobs cover the prompt, error classes), so it works
against any model. Prompts use only lowercase ASCII letters and spaces. Exits non-zero on the
first failure and prints one line per check.
"""

import sys

import openai

passed = 0
failed = 0


def check(name, cond, detail=""):
    global passed, failed
    if cond:
        passed += 1
        print(f"ok   {name}")
    else:
        failed += 1
        print(f"FAIL {name} {detail}")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    base = sys.argv[1].rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120)

    # models.list
    models = client.models.list()
    ids = [m.id for m in models.data]
    check("models.list returns a model", len(ids) >= 1, str(ids))
    model = ids[0]

    # chat.completions, non-streaming
    messages = [{"role": "user", "content": "say hello"}]
    chat = client.chat.completions.create(
        model=model, messages=messages, max_tokens=16, temperature=0, seed=1
    )
    choice = chat.choices[0]
    check("chat object", chat.object == "chat.completion", chat.object)
    check("chat role", choice.message.role == "assistant")
    check("chat content is a string", isinstance(choice.message.content, str))
    check("chat finish_reason", choice.finish_reason in ("stop", "length"), choice.finish_reason)
    check(
        "chat usage",
        chat.usage.completion_tokens >= 1
        and chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens,
        str(chat.usage),
    )

    # chat.completions, streaming: same text at temperature 0
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=16,
        temperature=0,
        seed=1,
        stream=True,
        stream_options={"include_usage": True},
    )
    parts, finish, usage, first_role = [], None, None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if first_role is None and c.delta.role:
                first_role = c.delta.role
            if c.delta.content:
                parts.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    check("chat stream role first", first_role == "assistant", str(first_role))
    check(
        "chat stream text equals non-stream",
        "".join(parts) == choice.message.content,
        repr(("".join(parts), choice.message.content)),
    )
    check("chat stream finish_reason", finish == choice.finish_reason, str(finish))
    check(
        "chat stream usage chunk",
        usage is not None and usage.completion_tokens == chat.usage.completion_tokens,
        str(usage),
    )

    # completions with a text prompt and token ids
    comp = client.completions.create(
        model=model,
        prompt="hello world",
        max_tokens=8,
        temperature=0,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    c0 = comp.choices[0]
    extra = c0.model_extra or {}
    prompt_ids = extra.get("prompt_token_ids")
    gen_ids = extra.get("token_ids")
    check("completion object", comp.object == "text_completion", comp.object)
    check("completion text", isinstance(c0.text, str))
    check(
        "return_token_ids",
        isinstance(gen_ids, list) and len(gen_ids) == comp.usage.completion_tokens == 8,
        str(extra),
    )
    check(
        "prompt_token_ids",
        isinstance(prompt_ids, list) and len(prompt_ids) == comp.usage.prompt_tokens,
        str(prompt_ids),
    )

    comp_ids = client.completions.create(
        model=model,
        prompt=prompt_ids,
        max_tokens=8,
        temperature=0,
        extra_body={
            "return_token_ids": True,
            "ignore_eos": True,
            "add_special_tokens": False,
            "prompt_logprobs": 1,
        },
    )
    e0 = comp_ids.choices[0].model_extra or {}
    check("id prompt gives the same tokens", e0.get("token_ids") == gen_ids, str(e0.get("token_ids")))
    check("id prompt gives the same text", comp_ids.choices[0].text == c0.text)
    plp = e0.get("prompt_logprobs")
    ok = isinstance(plp, list) and len(plp) == len(prompt_ids) and plp[0] is None
    if ok:
        for i in range(1, len(prompt_ids)):
            entry = plp[i].get(str(prompt_ids[i]))
            ok = ok and entry is not None and entry["logprob"] <= 0.0
    check("prompt_logprobs cover the prompt with the actual tokens", ok, str(plp)[:200])

    # completions streaming
    s = client.completions.create(
        model=model, prompt="hello world", max_tokens=8, temperature=0, stream=True,
        extra_body={"ignore_eos": True},
    )
    text = "".join(ch.choices[0].text for ch in s if ch.choices)
    check("completion stream text equals non-stream", text == c0.text, repr((text, c0.text)))

    # logprobs + echo
    lp = client.completions.create(
        model=model, prompt="hello world", max_tokens=4, temperature=0, logprobs=2, echo=True,
        extra_body={"ignore_eos": True},
    )
    l0 = lp.choices[0]
    check("echo prepends the prompt", l0.text.startswith("hello world"), repr(l0.text))
    check(
        "logprobs object",
        l0.logprobs is not None
        and len(l0.logprobs.tokens) == lp.usage.prompt_tokens + 4
        and l0.logprobs.token_logprobs[0] is None,
        str(l0.logprobs)[:200],
    )

    # errors
    try:
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=1)
        check("unknown model -> NotFoundError", False, "no exception")
    except openai.NotFoundError as e:
        check("unknown model -> NotFoundError", e.status_code == 404)
    for name, kwargs in [
        ("max_tokens=0", dict(max_tokens=0)),
        ("n=2", dict(max_tokens=1, n=2)),
        ("token id out of range", dict(max_tokens=1, prompt=[10**9])),
    ]:
        kwargs.setdefault("prompt", "hi")
        try:
            client.completions.create(model=model, **kwargs)
            check(f"{name} -> BadRequestError", False, "no exception")
        except openai.BadRequestError as e:
            body = e.body if isinstance(e.body, dict) else {}
            check(f"{name} -> BadRequestError", e.status_code == 400 and "message" in body, str(e.body))
    try:
        client.chat.completions.create(model=model, messages=[], max_tokens=1)
        check("empty messages -> BadRequestError", False, "no exception")
    except openai.BadRequestError:
        check("empty messages -> BadRequestError", True)

    # the server still works after the errors
    again = client.completions.create(
        model=model, prompt="hello world", max_tokens=8, temperature=0,
        extra_body={"ignore_eos": True},
    )
    check("server healthy after errors", again.choices[0].text == c0.text)

    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
