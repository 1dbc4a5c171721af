"""The trainer's speed levers (playground/train/perf.py) on a tiny model, CPU: packing must compute the
same loss and gradients as the padded batch, with no attention or target across examples."""

from __future__ import annotations

from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch")

from playground.train.perf import model_inputs, pack_rows  # noqa: E402


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three right-padded rows of lengths 5, 2, 4 (pad id 0); prompts (label -100) of 2, 1, 1 tokens."""
    ids = torch.tensor([[11, 12, 13, 14, 15], [21, 22, 0, 0, 0], [31, 32, 33, 34, 0]])
    labels = torch.tensor([[-100, -100, 13, 14, 15], [-100, 22, -100, -100, -100], [-100, 32, 33, 34, -100]])
    return ids, labels, torch.tensor([5, 2, 4])


def _tiny_causal_lm(arch: str) -> torch.nn.Module:
    """A seeded 2-layer Llama or Qwen2 causal LM (vocabulary 64, pad id 0), float32, SDPA attention."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    dims = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)  # fmt: skip
    config = LlamaConfig(**dims) if arch == "llama" else Qwen2Config(**dims)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")


def _loss_and_grads(
    model: torch.nn.Module, compute_loss: Callable[[], torch.Tensor]
) -> tuple[float, list[torch.Tensor]]:
    """The loss ``compute_loss()`` returns and every parameter's gradient from it."""
    model.zero_grad()
    loss = compute_loss()
    loss.backward()
    return loss.item(), [p.grad.clone() for p in model.parameters()]


def test_pack_rows_layout() -> None:
    ids, labels, lengths = _batch()
    packed_ids, packed_labels, positions = pack_rows(ids, labels, lengths)
    assert packed_ids.tolist() == [[11, 12, 13, 14, 15, 21, 22, 31, 32, 33, 34]]
    assert positions.tolist() == [[0, 1, 2, 3, 4, 0, 1, 0, 1, 2, 3]]
    # every example's first token is never a target (it would be predicted from the previous example)
    assert packed_labels.tolist() == [[-100, -100, 13, 14, 15, -100, 22, -100, 32, 33, 34]]
    assert labels[1, 0] == -100 and ids[1, 2] == 0  # the inputs are not modified


def test_packed_row_rounded_up_by_a_filler_of_its_own() -> None:
    """With a width multiple the row gets a padding filler: positions from 0 (its own sequence), no labels."""
    ids, labels, lengths = _batch()
    packed_ids, packed_labels, positions = pack_rows(ids, labels, lengths, width_multiple=8)
    assert packed_ids.tolist() == [[11, 12, 13, 14, 15, 21, 22, 31, 32, 33, 34, 0, 0, 0, 0, 0]]
    assert positions.tolist() == [[0, 1, 2, 3, 4, 0, 1, 0, 1, 2, 3, 0, 1, 2, 3, 4]]
    assert packed_labels.tolist() == [[-100, -100, 13, 14, 15, -100, 22, -100, 32, 33, 34] + [-100] * 5]
    # a row already a multiple wide gets none
    assert pack_rows(ids, labels, lengths, width_multiple=11)[0].shape == (1, 11)


def test_model_inputs_leave_full_or_unpacked_batches_alone() -> None:
    ids, labels, lengths = _batch()
    assert set(model_inputs(ids, labels, lengths, packing=False)) == {"input_ids", "labels", "use_cache"}
    full = model_inputs(ids[:, :2], labels[:, :2], torch.tensor([2, 2, 2]), packing=True)
    assert set(full) == {"input_ids", "labels", "use_cache"} and full["input_ids"].shape == (3, 2)
    assert model_inputs(ids, labels, lengths, packing=True)["input_ids"].shape == (1, 11)


@pytest.mark.parametrize("width_multiple", [1, 16], ids=["exact-width", "rounded-width"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_packed_loss_and_gradients_equal_the_padded_batch(arch: str, width_multiple: int) -> None:
    """Same loss, same gradients: the block-diagonal mask keeps examples apart (a leak would change both),
    and a rounding filler is attended by no example."""
    model = _tiny_causal_lm(arch)
    gen = torch.Generator().manual_seed(1)
    lengths = torch.tensor([9, 3, 6, 12])
    ids = torch.randint(1, 64, (4, 12), generator=gen)
    labels = ids.clone()
    labels[:, :2] = -100  # a two-token prompt
    for row, n in enumerate(lengths):
        ids[row, n:] = 0
        labels[row, n:] = -100

    padded = model_inputs(ids, labels, lengths, packing=False)
    padded_loss, padded_grads = _loss_and_grads(model, lambda: model(**padded).loss)
    packed = model_inputs(ids, labels, lengths, packing=True, width_multiple=width_multiple)
    assert packed["input_ids"].shape == (1, -(-int(lengths.sum()) // width_multiple) * width_multiple)
    packed_loss, packed_grads = _loss_and_grads(model, lambda: model(**packed).loss)
    assert packed_loss == pytest.approx(padded_loss, rel=1e-5)
    for a, b in zip(padded_grads, packed_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    # the trainer's loss (answer positions' logits only) on the packed row: the same loss
    from playground.train.perf import causal_lm_loss

    answers = int((labels[:, 1:] != -100).sum())
    assert causal_lm_loss(model, packed, answers).item() == pytest.approx(padded_loss, rel=1e-5)

    # without the position restarts the examples would attend to each other: a different loss
    leaky = {"input_ids": packed["input_ids"], "labels": packed["labels"], "use_cache": False}
    assert model(**leaky).loss.item() != pytest.approx(padded_loss, rel=1e-4)


@pytest.mark.parametrize("boolean_mask", [True, False], ids=["exact-positions", "shared-positions"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_answer_only_logits_give_the_full_loss_and_gradients(arch: str, boolean_mask: bool) -> None:
    """The training loss from answer positions' logits only equals transformers' loss over all logits, with
    the same gradients; and it really skips positions (a model call that saw all of them would be no faster)."""
    from playground.train.perf import boolean_logits_mask, causal_lm_loss

    if boolean_mask and not boolean_logits_mask():
        pytest.skip("this transformers takes no boolean logits_to_keep (the shared-positions form covers it)")
    model = _tiny_causal_lm(arch)
    gen = torch.Generator().manual_seed(2)
    lengths, prompts = torch.tensor([9, 3, 6, 12]), torch.tensor([4, 1, 5, 2])
    ids = torch.randint(1, 64, (4, 12), generator=gen)
    labels = ids.clone()
    for row, (n, prompt) in enumerate(zip(lengths, prompts, strict=True)):
        ids[row, n:] = 0
        labels[row, n:] = -100
        labels[row, :prompt] = -100
    n_items = int((labels[:, 1:] != -100).sum()) + 7  # a step total over more micro-batches than this one
    inputs = {"input_ids": ids, "labels": labels, "use_cache": False}
    seen: list[tuple[int, ...]] = []
    hook = model.lm_head.register_forward_hook(lambda _m, _i, out: seen.append(tuple(out.shape)))

    full_loss, full_grads = _loss_and_grads(model, lambda: causal_lm_loss(model, inputs, n_items, answer_only=False))
    answer_loss, answer_grads = _loss_and_grads(
        model, lambda: causal_lm_loss(model, inputs, n_items, answer_only=True, boolean_mask=boolean_mask)
    )
    hook.remove()
    assert answer_loss == pytest.approx(full_loss, rel=1e-6)
    for a, b in zip(full_grads, answer_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    all_positions = 4 * 12
    kept = seen[1][0] if boolean_mask else seen[1][0] * seen[1][1]
    assert seen[0][:2] == (4, 12)
    needed = labels[:, 1:] != -100
    assert kept == (int(needed.sum()) if boolean_mask else 4 * int(needed.any(0).sum())) < all_positions
