"""PackedDataset over tokenized shards: lengths from the index (a column, an expression
over a member's size, a callable of the index's arrays), packs read whole, views
packed, ``collate_packs`` driving variable-length attention."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from packcorpus import as_uint16, dataset, write_corpus
from procstats import mapping_of
from torch.utils.data import DataLoader

import indextar
from indextar import PackedDataset, ResumableSampler, collate_packs
from indextar.index.arrays import ShardArrays


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def token_sizes(arrays: ShardArrays) -> np.ndarray:
    """Each sample's ``.tokens`` member's size in tokens, from the index's arrays."""
    members = arrays.members
    is_tokens = members[:, 2] == arrays.ext_names.index("tokens")
    return members[is_tokens, 1] // 2


def documents(ds: indextar.IndexedTarDataset) -> list[np.ndarray]:
    return [ds[i] for i in range(len(ds))]


def test_lengths_from_a_column_an_expression_a_callable_agree(corpus: str) -> None:
    ds = dataset(corpus)
    truth = np.array([len(d) for d in documents(ds)])
    for lengths in ("num_tokens", "size(tokens) / 2", token_sizes, truth):
        packed = PackedDataset(ds, max_length=64, lengths=lengths)
        assert np.array_equal(packed.lengths, truth), lengths
    with pytest.raises(indextar.SelectionError, match="have no length.*doc00001.*tok-000000.tar"):
        PackedDataset(ds, max_length=64, lengths="size(tokens) / 3.0")
    with pytest.raises(ValueError, match="one value per sample"):
        PackedDataset(ds, max_length=64, lengths=truth[1:])


@pytest.mark.parametrize("strategy", ["best-fit", "first-fit", "concat-split"])
def test_packs_hold_every_document_once(corpus: str, strategy: str) -> None:
    ds = dataset(corpus)
    docs = documents(ds)
    packed = PackedDataset(ds, max_length=64, lengths="num_tokens", strategy=strategy, seed=3)  # type: ignore[arg-type]
    assert len(packed) == len(packed.plan) and packed.plan.overlong > 0
    pieces: dict[int, list[np.ndarray]] = {}
    everything = packed.__getitems__(list(range(len(packed))))
    for i, pack in enumerate(everything):
        assert len(pack) <= 64
        assert [t.tolist() for t in pack.tokens] == [t.tolist() for t in packed[i].tokens]
        for index, tokens in zip(pack.indices.tolist(), pack.tokens):
            pieces.setdefault(index, []).append(tokens)
    assert sorted(pieces) == list(range(len(ds)))
    for index, parts in pieces.items():
        whole = np.concatenate(parts)  # concat-split: packs in order keep pieces in order
        if strategy == "concat-split":
            assert np.array_equal(whole, docs[index])
        else:
            assert len(parts) == 1 and np.array_equal(whole, docs[index][:64])


def test_views_are_packed(corpus: str, tmp_path: Path) -> None:
    ds = dataset(corpus)
    view = ds.where("num_tokens < 40", cache_dir=tmp_path).exclude(["doc00003"])
    packed = PackedDataset(view, max_length=50, lengths="size(tokens) / 2")
    read = packed.__getitems__(list(range(len(packed))))
    indices = sorted(i for pack in read for i in pack.indices.tolist())
    assert indices == list(range(len(view)))
    assert all(len(t) < 40 for pack in read for t in pack.tokens)
    assert packed.selection["data"]["where"] == ["num_tokens < 40"]


def test_collate_gives_positions_labels_and_boundaries(corpus: str) -> None:
    packed = PackedDataset(dataset(corpus), max_length=64, lengths="num_tokens", seed=1)
    packs = packed.__getitems__([0, 1, 2])
    batch = collate_packs(packs)
    assert batch["input_ids"].shape == (3, 64)
    flat_ids = batch["input_ids"].reshape(-1)
    flat_pos = batch["position_ids"].reshape(-1)
    flat_labels = batch["labels"].reshape(-1)
    cu = batch["cu_seqlens"].tolist()
    assert cu[0] == 0 and cu[-1] == 3 * 64
    for start, end in zip(cu, cu[1:]):
        assert flat_pos[start:end].tolist() == list(range(end - start))
        assert flat_labels[start] == -100
        real = flat_labels[start + 1 : end] != -100
        assert torch.equal(flat_labels[start + 1 : end][real], flat_ids[start + 1 : end][real])
    for row, pack in enumerate(packs):
        used = len(pack)
        assert torch.equal(
            batch["input_ids"][row, :used],
            torch.from_numpy(np.concatenate(pack.tokens).astype(np.int64)),
        )
        assert (batch["labels"][row, used:] == -100).all() and (
            batch["input_ids"][row, used:] == 0
        ).all()


def test_collate_int32_holds_the_same_values(corpus: str) -> None:
    packed = PackedDataset(dataset(corpus), max_length=64, lengths="num_tokens", seed=2)
    packs = packed.__getitems__([0, 3, 5, 7])
    wide = collate_packs(packs, pad_id=7)
    narrow = collate_packs(packs, pad_id=7, dtype=torch.int32)
    for field in ("input_ids", "labels", "position_ids"):
        assert wide[field].dtype == torch.int64 and narrow[field].dtype == torch.int32
        assert torch.equal(wide[field], narrow[field].long())
    assert torch.equal(wide["cu_seqlens"], narrow["cu_seqlens"])
    assert wide["max_seqlen"] == narrow["max_seqlen"]
    with pytest.raises(ValueError, match="torch.int64 or torch.int32"):
        collate_packs(packs, dtype=torch.float32)


def test_collated_batch_crosses_from_a_worker_in_one_block(corpus: str) -> None:
    """The tensors of a batch are views of one buffer: a worker shares one block of
    memory a batch, not one per tensor (the cost of a batch through the queue)."""
    packed = PackedDataset(dataset(corpus), max_length=64, lengths="num_tokens")
    loader = DataLoader(
        packed, batch_size=4, sampler=ResumableSampler(packed, seed=1), num_workers=2,
        collate_fn=collate_packs,
    )  # fmt: skip
    for batch, _ in zip(loader, range(3)):
        tensors = [batch[f] for f in ("input_ids", "labels", "position_ids", "cu_seqlens")]
        blocks = {t.untyped_storage().data_ptr() for t in tensors}
        assert len(blocks) == 1 and "/dev/shm/" in mapping_of(tensors[0].data_ptr())
        assert batch["input_ids"].is_contiguous() and batch["cu_seqlens"].dtype == torch.int32


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_collated_batches_reuse_a_workers_blocks(corpus: str, method: str) -> None:
    """Through real workers, each batch is what collate_packs makes in-process; the
    workers fill a few reused blocks (a batch crosses as its block's name), never one
    a batch, and a batch kept past later ones stays its own."""
    packed = PackedDataset(dataset(corpus), max_length=64, lengths="num_tokens")
    order = list(ResumableSampler(packed, seed=1))
    want = [collate_packs(packed.__getitems__(order[i : i + 4])) for i in range(0, len(order), 4)]
    loader = DataLoader(
        packed, batch_size=4, sampler=order, num_workers=2, collate_fn=collate_packs,
        multiprocessing_context=method,
    )  # fmt: skip
    kept, blocks = [], set()
    for n, (batch, expected) in enumerate(zip(loader, want, strict=True)):
        assert type(batch) is dict and batch["max_seqlen"] == expected["max_seqlen"]
        for name in ("input_ids", "labels", "position_ids", "cu_seqlens"):
            assert torch.equal(batch[name], expected[name]), (n, name)
        blocks.add(mapping_of(batch["input_ids"].untyped_storage().data_ptr()))
        if n == 0:
            kept.append((batch, expected))  # held: its block is not filled again
    # a few a worker (in flight, held, grown), not one a batch
    assert len(want) >= 16 and 2 <= len(blocks) <= len(want) // 2, blocks
    batch, expected = kept[0]
    assert all(torch.equal(batch[k], expected[k]) for k in ("input_ids", "labels", "cu_seqlens"))
    kept.clear()
    fresh = DataLoader(
        packed, batch_size=4, sampler=order, num_workers=2, multiprocessing_context=method,
        collate_fn=functools.partial(collate_packs, reuse=False),
    )  # fmt: skip
    apart = {mapping_of(b["input_ids"].untyped_storage().data_ptr()) for b in fresh}
    assert len(apart) == len(want)  # reuse=False: a new block a batch, as before


class TinyLM(torch.nn.Module):
    """One causal self-attention layer with rotary-free learned positions."""

    def __init__(self, vocab: int = 1000, width: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.embed = torch.nn.Embedding(vocab, width)
        self.position = torch.nn.Embedding(64, width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.out = torch.nn.Linear(width, vocab)

    def forward(
        self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        x = self.embed(ids) + self.position(positions)
        q, k, v = self.qkv(x).unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 1, 4)
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(y.transpose(1, 2).flatten(-2))


def block_causal_mask(cu_seqlens: torch.Tensor, rows: int, width: int) -> torch.Tensor:
    """``(rows, 1, width, width)`` bool: a token sees earlier tokens of its own segment."""
    segment = torch.repeat_interleave(
        torch.arange(len(cu_seqlens) - 1), torch.diff(cu_seqlens.long())
    ).reshape(rows, width)
    same = segment[:, :, None] == segment[:, None, :]
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    return (same & causal)[:, None]


def test_collate_drives_variable_length_attention(corpus: str) -> None:
    torch.manual_seed(0)
    model = TinyLM().eval()
    packed = PackedDataset(
        dataset(corpus), max_length=64, lengths="num_tokens", strategy="first-fit"
    )
    loader = DataLoader(
        packed, batch_size=8, sampler=ResumableSampler(packed, seed=5), collate_fn=collate_packs,
        num_workers=2,
    )  # fmt: skip
    batch = next(iter(loader))
    mask = block_causal_mask(batch["cu_seqlens"], 8, 64)
    with torch.no_grad():
        packed_out = model(batch["input_ids"], batch["position_ids"], mask)
        checked = 0
        cu = batch["cu_seqlens"].tolist()
        for start, end in zip(cu, cu[1:]):
            row, at = divmod(start, 64)
            if (batch["labels"].reshape(-1)[start + 1 : end] == -100).all() and end - start > 1:
                continue  # the padding
            ids = batch["input_ids"][row : row + 1, at : at + end - start]
            alone = model(ids, torch.arange(end - start)[None], None)
            torch.testing.assert_close(packed_out[row : row + 1, at : at + end - start], alone)
            checked += 1
    assert checked > 8  # more documents than packs: some share one
    # and without the mask the documents would see each other: the check can fail
    with torch.no_grad():
        leaky = model(batch["input_ids"], batch["position_ids"], None)
    assert not torch.allclose(leaky, packed_out)


def test_as_uint16_reads_the_member() -> None:
    assert as_uint16((np.arange(3, dtype=np.uint16).tobytes(),)).tolist() == [0, 1, 2]


def test_a_mixture_of_packed_parts_is_weighted_by_tokens(corpus: str) -> None:
    """Weights over packed parts are shares of tokens, not of packs: a part whose packs
    hold four times the tokens is drawn a quarter as often for the same share."""
    ds = dataset(corpus)
    short = PackedDataset(ds, max_length=32, lengths="num_tokens", strategy="concat-split")
    long = PackedDataset(ds, max_length=128, lengths="num_tokens", strategy="concat-split")
    mixture = indextar.MixtureDataset({"short": short, "long": long})
    pack_tokens = np.array(
        [sum(len(t) for t in part[i].tokens) for part in (short, long) for i in range(len(part))]
    )
    for weights in ({"short": 0.5, "long": 0.5}, {"short": 0.8, "long": 0.2}):
        sampler = ResumableSampler(mixture, weights=weights, epoch_length=2000, seed=4)
        drawn = np.array(list(sampler))
        is_short = drawn < len(short)
        tokens = pack_tokens[drawn]
        share = tokens[is_short].sum() / tokens.sum()
        assert share == pytest.approx(weights["short"], abs=0.03), (weights, share)
        parts = sampler.state_dict()["selection"]
        assert [part["max_length"] for part in parts] == [32, 128]  # checked on resume
    # Without token counts (a plain concatenation of the same packs) weights count packs.
    plain = indextar.MixtureDataset({"short": list(short), "long": list(long)})
    sampler = ResumableSampler(plain, weights={"short": 0.5, "long": 0.5}, epoch_length=2000)
    drawn = np.array(list(sampler))
    assert (drawn < len(short)).mean() == pytest.approx(0.5, abs=0.01)
    # The mixture of packs reads and collates in a DataLoader with workers.
    loader = DataLoader(
        mixture,
        batch_size=4,
        sampler=ResumableSampler(mixture, weights={"short": 0.5, "long": 0.5}, epoch_length=24),
        collate_fn=lambda packs: [collate_packs([p]) for p in packs],
        num_workers=2,
    )
    widths = {b["input_ids"].shape[1] for batch in loader for b in batch}
    assert widths == {32, 128}
