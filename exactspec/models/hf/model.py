"""A Hugging Face causal LM behind the `LanguageModel` protocol, with a KV cache per row.

The decoding engine only ever hands over token histories. This adapter finds,
for each row, how much of the history its KV cache already holds and feeds the
rest; rejected draft tokens are rolled back by marking their cache slots
invalid (bookkeeping), never by recomputing the prompt.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from exactspec.models.hf.attention import NAME as GROUPED_ATTENTION
from exactspec.models.hf.attention import use_grouped_attention
from exactspec.models.hf.modules import model_eos_ids, module_copy, output_rows
from exactspec.models.hf.slots import CacheSlots
from exactspec.models.hf.two_rows import use_two_row_linears
from exactspec.models.rows_cache import PendingTree, RowCacheModel, TreeBatch, keep_length

# Token written into padding slots. Its value never matters: padding slots are
# masked out of every attention, so any valid id will do.
_PAD_TOKEN_ID = 0

TREE_MASK_ATTENTION = ("sdpa", "eager", GROUPED_ATTENTION)
"""Attention implementations a tree pass can hand an explicit [B, 1, W, S + W] mask to (transformers returns
a 4D mask as it is; sdpa and the grouped attention take it boolean, eager additive). Models with another
implementation (flash attention) score trees path by path."""


class HFLanguageModel(CacheSlots, RowCacheModel):
    """A `transformers` causal LM as a `LanguageModel`, with one KV cache row per row id.

    Cache layout. The cache is one `DynamicCache` whose batch index b holds one
    row id (any order) and whose S slots are shared by all rows. A slot
    is either valid for its row (it holds the K/V of one real token of that
    row's history) or a hole (left padding, or a rolled-back draft token). The
    adapter keeps, per row, the real tokens and the slot of each, and passes the
    model an explicit 2D attention mask over the slots (1 = valid) and explicit
    position ids (number of real tokens before the slot in that row), so a row
    computes exactly what it would compute alone with a hole-free cache.

    Example: rows [a b c] and [d e] are prefilled (row 1 is left-padded so both
    last tokens sit in the last slot), then score the drafts [x y] and [u v];
    row 0 rejects y and outputs z, row 1 accepts both and adds the bonus w. The
    next call, with histories [a b c x z] and [d e u v w] and k = 1, keeps the
    longest cached prefix of each row (4 tokens each), marks y's slot as a hole
    and feeds one new token per row:

        slot        0  1  2  3  4  5
        row 0       a  b  c  x  y  z      mask 1 1 1 1 0 1   positions 0 1 2 3 . 4
        row 1       .  d  e  u  v  w      mask 0 1 1 1 1 1   positions . 0 1 2 3 4

    Rows join and leave independently (continuous batching, docs/algorithm.md 6): rows with
    unknown ids are prefilled in a batch of their own and then appended to the cache (holes
    in front align the slot counts), `release_rows(rows)` drops rows, and a call that names only
    some of the cached rows feeds the others nothing (they ride along with padding, their
    cache untouched); no call recomputes a row it did not name. Releasing is bookkeeping: the
    released rows' K/V leave the cache together at the start of the next call (or at once when
    no row is left), since taking rows out one by one copies the cache once per row, which is
    quadratic when thousands of rows of one batch finish in the same round.

    Slots that are holes in every row at the end of the cache are cropped away
    (with one row there are therefore never holes: rollback is a crop). When
    compaction would free more than a fraction `max_hole_fraction` of the slots,
    the cache is compacted: each row's valid slots are gathered, in order,
    right-aligned in a cache as long as the longest row. The default 0.5 keeps
    attention over holes within 2x of the hole-free cost and copies the whole
    cache only after the holes have grown as long as the longest row.

    Trees of candidates (`tree_logits`) are scored in one forward: each node takes a slot after the
    row's new tokens, sees the row's valid slots and its own ancestors only (an explicit 4D mask), and
    stays a hole until the row's next call, which keeps the slots of the path its history follows.

    Only plain full-attention `DynamicLayer` caches are supported: sliding
    window and linear-attention layers index by slot, and holes would break them.
    The model is put in eval mode (dropout off): the target forward pass must be
    deterministic given its input (docs/algorithm.md 2.6).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        eos_token_ids: Iterable[int] | None = None,
        vocab_size: int | None = None,
        max_hole_fraction: float = 0.5,
        grouped_attention: bool = True,
        two_row_linears: bool = True,
    ) -> None:
        """
        Args:
            model: a causal LM whose forward accepts `attention_mask`, `position_ids`
                and a `DynamicCache`.
            eos_token_ids: ids that end generation; default the union of the
                model's generation config and config `eos_token_id`.
            vocab_size: V, the number of logits rows returned; default the rows of
                the model's output layer. A smaller V drops the trailing rows
                (padding rows of an enlarged embedding matrix).
            max_hole_fraction: compact the cache when more than this fraction of
                its slots could be freed by compaction (0 compacts whenever
                possible, 1 never compacts).
            grouped_attention: on CPU, switch a model that uses transformers' "sdpa" attention to
                `exactspec.models.hf.attention` (torch's fused CPU kernel is several times slower
                for decoding's few query tokens in bfloat16; the module says what was measured).
            two_row_linears: on CPU, multiply a dense bfloat16 linear layer's lone input row as
                two equal rows (`exactspec.models.hf.two_rows`): a one-token pass then computes
                each row as the verifier's k-token pass does, bit for bit, and faster.

        The adapter wraps, it does not patch: both switches (and eval mode) are made on its own
        structural copy of `model` (`module_copy`: new module objects and config, the same weight
        tensors, so no memory is duplicated). The caller's module, its config and its attention
        implementation stay as they were, so transformers' own `generate` on it runs stock
        transformers (the benchmark's and the audit's peer).
        """
        if not 0.0 <= max_hole_fraction <= 1.0:
            raise ValueError(f"max_hole_fraction must lie in [0, 1], got {max_hole_fraction}")
        logits_rows = output_rows(model)
        if vocab_size is None:
            vocab_size = logits_rows
        if not 1 <= vocab_size <= logits_rows:
            raise ValueError(
                f"vocab_size must lie in 1..{logits_rows} (the model's logits rows), got {vocab_size}"
            )
        eos = frozenset(int(t) for t in eos_token_ids) if eos_token_ids is not None else model_eos_ids(model)
        if not eos:
            raise ValueError(
                "no EOS id known: the model's config and generation config have no eos_token_id; "
                "pass eos_token_ids explicitly"
            )
        if any(not 0 <= t < vocab_size for t in eos):
            raise ValueError(f"EOS ids {sorted(eos)} must lie in 0..{vocab_size - 1}")
        unsupported = {type(layer).__name__ for layer in DynamicCache(config=model.config).layers} - {
            DynamicLayer.__name__
        }
        if unsupported:
            raise NotImplementedError(
                f"cache layers {sorted(unsupported)} are not supported: only full-attention DynamicLayer "
                "caches can hold holes"
            )

        self._model = module_copy(model).eval()
        if grouped_attention:
            use_grouped_attention(self._model)
        if two_row_linears:
            use_two_row_linears(self._model)
        self._vocab_size = vocab_size
        self._eos_token_ids = eos
        self._max_hole_fraction = max_hole_fraction
        self._device = next(model.parameters()).device
        parameters = inspect.signature(model.forward).parameters
        # transformers renamed `past_key_values` to `cache` during 5.x; accept both.
        self._cache_kwarg = "cache" if "cache" in parameters else "past_key_values"
        self._has_logits_to_keep = "logits_to_keep" in parameters
        self.clear_cache()

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def module(self) -> PreTrainedModel:
        """The adapter's own module (a structural copy of the one it was given, with its switches)."""
        return self._model

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos_token_ids

    def _fits_trees(self, rows: list[int], trees: TreeBatch) -> bool:
        """A tree pass needs an attention that takes an explicit 4D mask (`TREE_MASK_ATTENTION`)."""
        return self._model.config._attn_implementation in TREE_MASK_ATTENTION

    def _score(self, history_lists: list[list[int]], k: int, row_ids: list[int]) -> torch.Tensor:
        """[B, k, V] logits (`RowCacheModel.logits`): float64 for a float64 model (what lets `exactspec
        verify` enumerate the adapter exactly), float32 otherwise (bfloat16 and float16 models too)."""
        return self._logits(history_lists, k, row_ids)

    def _score_trees(
        self, history_lists: list[list[int]], row_ids: list[int], trees: TreeBatch
    ) -> torch.Tensor:
        """[B, N + 1, V] logits after each history and after each tree node, in one forward.

        Row b is fed the part of its history its cache lacks (at least the last token: the root's
        logits), then N node slots: node n at position len(history) + depth(n) - 1, attending to the
        row's valid slots, its new history tokens, its ancestors and itself, nothing else. The nodes'
        slots stay holes; the row's next call keeps those of the path its new history follows down the
        tree, so accepted candidates are not recomputed and the other branches are rolled back by the
        usual bookkeeping. Example: history [a b c] ([a b] cached), tree x (0) -> y (1), z (2) under the root:

            slot     0  1  2  3  4  5       query  sees slots       position
            row      a  b  c  x  y  z       c      0 1 2            2
                                            x      0 1 2 3          3
                                            y      0 1 2 3 4        4
                                            z      0 1 2 5          3

        A next history [a b c x q] keeps x's slot (y and z become holes) and feeds q.
        """
        return self._logits(history_lists, 1, row_ids, trees)

    # ---------------------------------------------------------------- internals

    def _logits(
        self, history_lists: list[list[int]], k: int, row_ids: list[int], trees: TreeBatch | None = None
    ) -> torch.Tensor:
        self._drop_released()
        requested = set(row_ids)
        others = [r for r in self._row_ids if r not in requested]
        if not others or self._cache is None:
            return self._logits_of(history_lists, k, row_ids, trees)
        # Cached rows this call does not name are set aside and merged back after: riding along, each
        # would be fed padding as wide as the widest requested feed (a prefill chunk, a draft's
        # catch-up), and every layer would compute it. Their cache is moved, never recomputed.
        aside = self._split_off(others)
        logits = self._logits_of(history_lists, k, row_ids, trees)
        self._merge_state(aside)
        return logits

    def _logits_of(
        self, history_lists: list[list[int]], k: int, row_ids: list[int], trees: TreeBatch | None = None
    ) -> torch.Tensor:
        """`_logits` for a call that names every cached row (and maybe new ones)."""
        joining = [j for j, r in enumerate(row_ids) if r not in self._row_ids]
        staying = [j for j, r in enumerate(row_ids) if r in self._row_ids]
        if not joining or not staying or self._cache is None:
            return self._logits_together(history_lists, k, row_ids, trees)
        # Rows that join are prefilled on their own: in one batch with the running rows, every
        # running row would be padded to the new prompts' length (their MLPs run on padding).
        running = self._take_state()
        new_logits = self._logits_together(
            [history_lists[j] for j in joining],
            k,
            [row_ids[j] for j in joining],
            None if trees is None else trees.select(joining),
        )
        joined = self._take_state()
        self._put_state(running)
        old_logits = self._logits_together(
            [history_lists[j] for j in staying],
            k,
            [row_ids[j] for j in staying],
            None if trees is None else trees.select(staying),
        )
        self._merge_state(joined)
        logits = old_logits.new_empty(len(row_ids), *old_logits.shape[1:])  # [B, k, V]
        logits[torch.tensor(staying, device=logits.device)] = old_logits
        logits[torch.tensor(joining, device=logits.device)] = new_logits
        return logits

    def _logits_together(
        self, history_lists: list[list[int]], k: int, row_ids: list[int], trees: TreeBatch | None = None
    ) -> torch.Tensor:
        """One forward over the cache's batch: requested rows fed their new tokens (then their trees' nodes,
        for a tree call: [B, N + 1, V] out), the others nothing."""
        self._add_rows(row_ids)
        # index[j]: the cache batch index of requested row j. Cached rows that are not requested
        # ride along with an empty feed (padding only): their cache is neither recomputed nor lost.
        index = [self._row_ids.index(r) for r in row_ids]
        targets: list[list[int]] = list(self._tokens)  # per batch index, the history after this call
        for j, b in enumerate(index):
            targets[b] = history_lists[j]
        for b, history in enumerate(targets):
            self._resolve_tree(b, history)  # the last tree's kept path becomes real tokens first
        requested = set(index)
        # Keep the longest cached prefix, but always feed at least k tokens to a requested row: the
        # logits of cached positions were not stored, so they are recomputed.
        keeps = [
            keep_length(cached, history, k) if b in requested else len(cached)
            for b, (cached, history) in enumerate(zip(self._tokens, targets, strict=True))
        ]
        for b, keep in enumerate(keeps):
            self._roll_back(b, keep)
        self._crop_trailing_holes()
        self._maybe_compact()
        feeds = [h[keep:] for h, keep in zip(targets, keeps, strict=True)]
        if trees is None:
            logits = self._forward(feeds, k)
        else:
            batch_trees = [([], [])] * len(feeds)  # rows riding along have no tree
            for j, b in enumerate(index):
                batch_trees[b] = (trees.tokens[j], trees.parents[j])
            logits = self._tree_forward(feeds, batch_trees, trees.width)
        self._tokens = targets
        if index == list(range(len(self._row_ids))):
            return logits
        return logits[torch.tensor(index, device=logits.device)]  # [B_requested, k, V]

    @property
    def device(self) -> torch.device:
        return self._device

    def _forward(self, feeds: list[list[int]], k: int) -> torch.Tensor:
        """One batched forward over the new tokens of every row; returns [B, k, V] logits (float32/64)."""
        width = max(len(f) for f in feeds)
        num_slots = self._valid.shape[1]
        fed = torch.tensor([len(f) for f in feeds], dtype=torch.long)  # [B]
        # Left-pad every row's block so its last token sits in the last slot. A padding
        # query with no real slot before it attends to nothing: torch >= 2.5 SDPA then
        # returns zeros (eager: a finite average), as in HF's own left-padded batching,
        # so the masked K/V it leaves in the cache are finite and never poison a row.
        offset = torch.arange(width)[None, :] - (width - fed)[:, None]  # [B, W], < 0 on padding
        new_valid = offset >= 0  # [B, W]
        position_ids = self._lengths()[:, None] + offset.clamp(min=0)  # [B, W]
        input_ids = torch.tensor([[_PAD_TOKEN_ID] * (width - len(f)) + f for f in feeds])  # [B, W]
        attention_mask = torch.cat([self._valid, new_valid], dim=1)  # [B, S + W]
        if self._cache is None:
            self._cache = DynamicCache(config=self._model.config)
        extra = {"logits_to_keep": k} if self._has_logits_to_keep else {}
        out = self._model(
            input_ids=input_ids.to(self._device),
            attention_mask=attention_mask.to(self._device, torch.long),
            position_ids=position_ids.to(self._device),
            use_cache=True,
            **{self._cache_kwarg: self._cache},
            **extra,
        )
        end = num_slots + width
        for b, f in enumerate(fed.tolist()):
            self._slots[b] = torch.cat([self._slots[b], torch.arange(end - f, end)])
        self._valid = attention_mask.bool()
        # Every requested row fed at least k tokens, so its last k slots are real (rows riding along
        # with an empty feed get padding logits, which `_logits` drops).
        logits = out.logits[:, -k:, : self._vocab_size]  # [B, k, V]
        # float64 stays float64 (the exact grid runs the adapter in float64); anything else is float32.
        return logits if logits.dtype == torch.float64 else logits.float()

    def _tree_forward(
        self, feeds: list[list[int]], trees: list[tuple[list[int], list[int]]], num_nodes: int
    ) -> torch.Tensor:
        """One forward over each row's new tokens and then its tree (`tree_logits`); [B, N + 1, V] logits.

        Layout of a row's W = H + N new slots: its feed left-padded to H, then its nodes in order, then
        padding nodes up to N. The mask is explicit ([B, 1, W, S + W]): a feed token sees the row's
        valid slots and the feed up to itself, a node the valid slots, the whole feed, its ancestors and
        itself; a padding query sees only its own slot (finite, never read). Positions count real
        tokens: a node at depth d (1 for a child of the root) sits at len(history) + d - 1.
        """
        batch = len(feeds)
        history_width = max(len(f) for f in feeds)
        num_slots = self._valid.shape[1]
        fed = torch.tensor([len(f) for f in feeds], dtype=torch.long)  # [B]
        offset = (
            torch.arange(history_width)[None, :] - (history_width - fed)[:, None]
        )  # [B, H], < 0 on padding
        fed_real = offset >= 0  # [B, H]
        before = self._lengths()  # [B] real tokens already cached
        depth, node_real, ancestors = _node_paths(trees, num_nodes)  # [B, N], [B, N], [B, N, N]
        position_ids = torch.cat(
            [
                before[:, None] + offset.clamp(min=0),
                torch.where(node_real, (before + fed)[:, None] + depth - 1, 0),
            ],
            dim=1,
        )  # [B, W]
        input_ids = torch.tensor(
            [
                [_PAD_TOKEN_ID] * (history_width - len(f))
                + f
                + tokens
                + [_PAD_TOKEN_ID] * (num_nodes - len(tokens))
                for f, (tokens, _) in zip(feeds, trees, strict=True)
            ]
        )  # [B, W]
        sees = self._tree_mask(fed_real, node_real, ancestors)  # [B, W, S + W]
        if self._cache is None:
            self._cache = DynamicCache(config=self._model.config)
        extra = {"logits_to_keep": num_nodes + 1} if self._has_logits_to_keep else {}
        out = self._model(
            input_ids=input_ids.to(self._device),
            attention_mask=self._mask_for_attention(sees[:, None].to(self._device)),
            position_ids=position_ids.to(self._device),
            use_cache=True,
            **{self._cache_kwarg: self._cache},
            **extra,
        )
        tree_start = num_slots + history_width
        for b, f in enumerate(fed.tolist()):
            self._slots[b] = torch.cat([self._slots[b], torch.arange(tree_start - f, tree_start)])
            tokens = trees[b][0]
            if tokens:
                self._trees[b] = PendingTree(
                    tokens, trees[b][1], torch.arange(tree_start, tree_start + len(tokens))
                )
        self._valid = torch.cat(
            [self._valid, fed_real, torch.zeros(batch, num_nodes, dtype=torch.bool)], dim=1
        )
        logits = out.logits[
            :, -(num_nodes + 1) :, : self._vocab_size
        ]  # [B, N + 1, V]: the last feed token, nodes
        return logits if logits.dtype == torch.float64 else logits.float()

    def _tree_mask(
        self, fed_real: torch.Tensor, node_real: torch.Tensor, ancestors: torch.Tensor
    ) -> torch.Tensor:
        """[B, W, S + W] bool, which slots each of a tree pass's W = H + N queries sees (`_tree_forward`):
        a feed token the row's valid slots and the feed up to itself, a node the valid slots, the whole
        feed, its ancestors and itself, a padding query only its own slot.

        fed_real [B, H]: real feed slots (the feed is left-padded); node_real [B, N]: real nodes;
        ancestors [B, N, N]: [b, n, m] node m is on node n's path."""
        batch, history_width = fed_real.shape
        num_nodes = node_real.shape[1]
        width = history_width + num_nodes
        num_slots = self._valid.shape[1]
        query_real = torch.cat([fed_real, node_real], dim=1)  # [B, W]
        sees_feed = torch.cat(
            [
                fed_real[:, None, :]
                & torch.ones(history_width, history_width, dtype=torch.bool).tril(),  # [B, H, H]
                fed_real[:, None, :].expand(batch, num_nodes, history_width),  # [B, N, H]
            ],
            dim=1,
        )  # [B, W, H]
        sees_nodes = torch.cat(
            [torch.zeros(batch, history_width, num_nodes, dtype=torch.bool), ancestors], dim=1
        )  # [B, W, N]
        sees = torch.cat(
            [self._valid[:, None, :].expand(batch, width, num_slots), sees_feed, sees_nodes], dim=2
        )
        sees &= query_real[:, :, None]  # [B, W, S + W]
        sees[:, :, num_slots:] |= torch.eye(width, dtype=torch.bool) & ~query_real[:, :, None]
        return sees

    def _mask_for_attention(self, sees: torch.Tensor) -> torch.Tensor:
        """sees [B, 1, W, S + W] bool (True = may attend) in the form the model's attention takes: boolean
        for sdpa and the grouped attention, additive (0 or the dtype's minimum) for eager."""
        if self._model.config._attn_implementation != "eager":
            return sees
        dtype = next(self._model.parameters()).dtype
        return torch.zeros(sees.shape, dtype=dtype, device=sees.device).masked_fill(
            ~sees, torch.finfo(dtype).min
        )


def _node_paths(
    trees: list[tuple[list[int], list[int]]], num_nodes: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(depth [B, N] long: 1 for a child of the root; node_real [B, N] bool: the row has node n;
    ancestors [B, N, N] bool: [b, n, m] node m is on node n's root-to-node path, n itself included) of
    each row's tree (tokens, parents), padded to N nodes."""
    batch = len(trees)
    depth = torch.zeros(batch, num_nodes, dtype=torch.long)
    node_real = torch.zeros(batch, num_nodes, dtype=torch.bool)
    ancestors = torch.zeros(batch, num_nodes, num_nodes, dtype=torch.bool)
    for b, (_, parents) in enumerate(trees):
        for n, parent in enumerate(parents):
            if parent >= 0:
                depth[b, n] = depth[b, parent] + 1
                ancestors[b, n] = ancestors[b, parent]
            else:
                depth[b, n] = 1
            ancestors[b, n, n] = True
            node_real[b, n] = True
    return depth, node_real, ancestors
