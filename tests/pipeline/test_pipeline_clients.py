"""Pipeline behaviour agent and benchmark clients rely on, over a scripted engine (exact chunking)."""

from __future__ import annotations

from deepseek_frontend.tokenization import PromptTokenizer

from .test_pipeline import make, request, run

EOS = "<｜end▁of▁sentence｜>"


def test_with_ignore_eos_an_eos_mid_stream_is_neither_text_nor_the_end(
    prompt_tokenizer: PromptTokenizer,
) -> None:
    """A real engine with ignore_eos keeps writing after an EOS the model emits anyway."""
    pipeline, backend = make(prompt_tokenizer, ["</think>first part", EOS, " and more"], finish="length")
    (acc,) = run(pipeline, request(ignore_eos=True, max_tokens=50))
    assert acc.content == "first part and more"
    assert EOS not in acc.content
    assert acc.finish_reason == "length"
    sampling = backend.requests[0].sampling
    # vLLM stops on stop_token_ids whatever ignore_eos says, so EOS is not sent as one
    assert sampling.ignore_eos is True and sampling.stop_token_ids == ()


def test_min_tokens_reaches_the_engine_capped_at_max_tokens(prompt_tokenizer: PromptTokenizer) -> None:
    pipeline, backend = make(prompt_tokenizer, ["</think>ok"])
    run(pipeline, request(min_tokens=500, max_tokens=40))
    assert backend.requests[0].sampling.min_new_tokens == 40


def test_a_continued_assistant_prefix_is_parsed_as_content_from_the_first_token(
    prompt_tokenizer: PromptTokenizer,
) -> None:
    """Thinking mode, but the prompt ends after ``</think>Once``: the output continues the answer."""
    pipeline, _ = make(prompt_tokenizer, [" upon a time"])
    messages = [{"role": "user", "content": "Tell a story"}, {"role": "assistant", "content": "Once"}]
    req = request(messages=messages)
    prepared = pipeline.prepare(req)
    assert prepared.continues_assistant is True
    assert prompt_tokenizer.decode(prepared.input_ids).endswith("<｜Assistant｜><think></think>Once")
    (acc,) = run(pipeline, req)
    assert acc.content == " upon a time" and acc.reasoning_content == ""
