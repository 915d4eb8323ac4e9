"""exactspec.kernels.attention: a query's output bits do not depend on the other queries, their order, the
thread count or the path; a tree node gets the bits of its path scored as a chain; the values match a float64
softmax(q k^T scale) v over the query's cells; the KV cache keeps its contents when copied and grown.

(Named test_attention_kernel.py: tests/models/test_attention.py exists, and pytest needs unique basenames.)
"""

from __future__ import annotations

import pytest
import torch

from exactspec.kernels.attention import KVCache, attend
from exactspec.kernels.paths import PathUnavailable, available_paths
from exactspec.kernels.rowwise import rms_norm

PATHS = available_paths()


def filled_cache(*, slots=3, kv_heads=2, head_size=128, capacity=160, layers=2, seed=0) -> KVCache:
    generator = torch.Generator().manual_seed(seed)
    cache = KVCache(layers=layers, slots=slots, kv_heads=kv_heads, head_size=head_size, capacity=capacity)
    for layer in range(layers):
        cache.keys[layer].copy_(torch.randn(cache.keys[layer].shape, generator=generator) * 2)
        cache.values[layer].copy_(torch.randn(cache.values[layer].shape, generator=generator))
    return cache


def random_lists(n: int, capacity: int, generator: torch.Generator) -> list[list[int]]:
    """n strictly increasing cell lists of lengths that cross the 16-lane boundaries (1, 15, 16, 17, ...)."""
    lengths = [1, 15, 16, 17, 33, 100, 2, 64]
    lists = []
    for i in range(n):
        length = lengths[i % len(lengths)]
        lists.append(sorted(torch.randperm(capacity, generator=generator)[:length].tolist()))
    return lists


def pack(lists: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    offsets = torch.tensor([0, *torch.tensor([len(c) for c in lists]).cumsum(0).tolist()], dtype=torch.int32)
    return offsets, torch.tensor([cell for c in lists for cell in c], dtype=torch.int32)


def reference(cache, layer, queries, slots, lists, scale) -> torch.Tensor:
    """float64 softmax(q k^T * scale) v over each query's cells."""
    n, heads, _ = queries.shape
    group = heads // cache.kv_heads
    out = torch.empty(queries.shape, dtype=torch.float64)
    for i in range(n):
        cells = torch.tensor(lists[i])
        for h in range(heads):
            keys = cache.keys[layer, int(slots[i]), h // group, cells].double()
            values = cache.values[layer, int(slots[i]), h // group, cells].double()
            weights = torch.softmax(keys @ queries[i, h].double() * scale, dim=0)
            out[i, h] = weights @ values
    return out


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("heads", "kv_heads", "head_size"), [(12, 2, 128), (4, 2, 40), (3, 3, 7)])
def test_matches_float64_softmax_over_the_listed_cells(path, heads, kv_heads, head_size):
    generator = torch.Generator().manual_seed(1)
    cache = filled_cache(kv_heads=kv_heads, head_size=head_size)
    lists = random_lists(6, cache.capacity, generator)
    offsets, cells = pack(lists)
    queries = torch.randn((6, heads, head_size), generator=generator)
    slots = torch.tensor([0, 2, 1, 0, 2, 1])
    scale = head_size**-0.5
    out = attend(cache, 1, queries, slots, offsets, cells, scale=scale, path=path)
    torch.testing.assert_close(
        out.double(), reference(cache, 1, queries, slots, lists, scale), rtol=0, atol=1e-5
    )


def test_every_path_gives_the_reference_paths_bits():
    generator = torch.Generator().manual_seed(2)
    cache = filled_cache(head_size=72)
    lists = random_lists(8, cache.capacity, generator)
    offsets, cells = pack(lists)
    queries = torch.randn((8, 12, 72), generator=generator) * 3
    slots = torch.randint(0, cache.slots, (8,), generator=generator)
    outs = [attend(cache, 0, queries, slots, offsets, cells, scale=0.2, path=path) for path in PATHS]
    for out in outs[1:]:
        assert torch.equal(out, outs[0])


@pytest.mark.parametrize("path", PATHS)
def test_a_querys_bits_do_not_depend_on_the_others_their_order_or_threads(path):
    generator = torch.Generator().manual_seed(3)
    cache = filled_cache()
    n = 16
    lists = random_lists(n, cache.capacity, generator)
    queries = torch.randn((n, 12, 128), generator=generator)
    slots = torch.randint(0, cache.slots, (n,), generator=generator)
    scale = 128**-0.5

    def run(indices: list[int], threads: int) -> torch.Tensor:
        offsets, cells = pack([lists[i] for i in indices])
        return attend(
            cache,
            1,
            queries[indices],
            slots[indices],
            offsets,
            cells,
            scale=scale,
            threads=threads,
            path=path,
        )

    alone = torch.stack([run([i], 1)[0] for i in range(n)])
    for threads in (1, 2, 3, 4):
        assert torch.equal(run(list(range(n)), threads), alone)
    order = torch.randperm(n, generator=generator).tolist()
    assert torch.equal(run(order, 2), alone[order])
    for size in (2, 3, 5, 8):
        chosen = torch.randperm(n, generator=generator)[:size].tolist()
        assert torch.equal(run(chosen, 3), alone[chosen])


@pytest.mark.parametrize("path", PATHS)
def test_a_chain_in_one_pass_gives_each_position_its_one_token_bits(path):
    generator = torch.Generator().manual_seed(4)
    cache = filled_cache()
    prefix, chain = 40, 8
    queries = torch.randn((chain, 12, 128), generator=generator)
    lists = [list(range(prefix + i + 1)) for i in range(chain)]
    offsets, cells = pack(lists)
    slots = torch.zeros(chain, dtype=torch.long)
    together = attend(cache, 0, queries, slots, offsets, cells, scale=0.1, path=path)
    for i in range(chain):
        one_offsets, one_cells = pack([lists[i]])
        alone = attend(cache, 0, queries[i : i + 1], slots[:1], one_offsets, one_cells, scale=0.1, path=path)
        assert torch.equal(alone[0], together[i])


@pytest.mark.parametrize("path", PATHS)
def test_a_tree_node_gets_the_bits_of_its_path_scored_as_a_chain(path):
    generator = torch.Generator().manual_seed(5)
    layers, kv_heads, head_size, prefix = 2, 2, 128, 30
    cache = KVCache(layers=layers, slots=2, kv_heads=kv_heads, head_size=head_size, capacity=64)
    # The prefix in slot 0; a tree of 7 nodes after it (parents before children), node k in cell prefix + k.
    parents = [-1, 0, 0, 1, 1, 2, 4]
    nodes = len(parents)
    node_keys = torch.randn((layers, nodes, kv_heads, head_size), generator=generator)
    node_values = torch.randn((layers, nodes, kv_heads, head_size), generator=generator)
    node_queries = torch.randn((nodes, 12, head_size), generator=generator)
    for layer in range(layers):
        cells = torch.arange(prefix)
        cache.write(
            layer,
            torch.zeros(prefix, dtype=torch.long),
            cells,
            torch.randn((prefix, kv_heads, head_size), generator=generator),
            torch.randn((prefix, kv_heads, head_size), generator=generator),
        )
        cache.write(
            layer,
            torch.zeros(nodes, dtype=torch.long),
            prefix + torch.arange(nodes),
            node_keys[layer],
            node_values[layer],
        )

    def path_to(node: int) -> list[int]:
        found = []
        while node >= 0:
            found.append(node)
            node = parents[node]
        return found[::-1]

    tree_lists = [list(range(prefix)) + [prefix + k for k in path_to(node)] for node in range(nodes)]
    offsets, cells = pack(tree_lists)
    tree = attend(
        cache, 1, node_queries, torch.zeros(nodes, dtype=torch.long), offsets, cells, scale=0.09, path=path
    )
    for node in range(nodes):
        # The same path as a chain in slot 1: the prefix, then the path's nodes in consecutive cells.
        chain_nodes = path_to(node)
        cache.copy_prefix(0, 1, prefix)
        for layer in range(layers):
            cache.write(
                layer,
                torch.ones(len(chain_nodes), dtype=torch.long),
                prefix + torch.arange(len(chain_nodes)),
                node_keys[layer, chain_nodes],
                node_values[layer, chain_nodes],
            )
        chain_offsets, chain_cells = pack([list(range(prefix + len(chain_nodes)))])
        chain = attend(
            cache,
            1,
            node_queries[node : node + 1],
            torch.ones(1, dtype=torch.long),
            chain_offsets,
            chain_cells,
            scale=0.09,
            path=path,
        )
        assert torch.equal(chain[0], tree[node])


def test_write_copy_prefix_and_grow_keep_contents():
    cache = KVCache(layers=3, slots=2, kv_heads=2, head_size=8, capacity=5)
    keys = torch.randn(4, 2, 8)
    values = torch.randn(4, 2, 8)
    cache.write(1, torch.tensor([0, 1, 0, 1]), torch.tensor([0, 0, 3, 4]), keys, values)
    assert torch.equal(cache.keys[1, 0, :, 3], keys[2])
    assert torch.equal(cache.values[1, 1, :, 4], values[3])
    cache.keys[:, 0].normal_()
    cache.copy_prefix(0, 1, 3)
    assert torch.equal(cache.keys[:, 1, :, :3], cache.keys[:, 0, :, :3])
    assert torch.equal(cache.values[1, 1, :, 4], values[3])  # past the prefix: untouched
    before_keys, before_values = cache.keys.clone(), cache.values.clone()
    cache.grow(slots=4, capacity=9)
    assert (cache.slots, cache.capacity) == (4, 9)
    assert cache.nbytes == 2 * 3 * 4 * 2 * 9 * 8 * 4
    assert torch.equal(cache.keys[:, :2, :, :5], before_keys)
    assert torch.equal(cache.values[:, :2, :, :5], before_values)
    assert not cache.keys[:, 2:].any() and not cache.keys[:, :, :, 5:].any()
    cache.grow(capacity=12)
    assert torch.equal(cache.values[:, :2, :, :5], before_values)
    with pytest.raises(ValueError, match="shrink"):
        cache.grow(slots=1)


def test_bad_cell_lists_and_slots_are_refused():
    cache = filled_cache(capacity=20)
    queries = torch.randn(1, 12, 128)
    slot = torch.zeros(1, dtype=torch.long)
    offsets = torch.tensor([0, 3], dtype=torch.int32)
    with pytest.raises(ValueError, match="strictly increasing"):
        attend(cache, 0, queries, slot, offsets, torch.tensor([0, 2, 2]), scale=1.0)
    with pytest.raises(ValueError, match="capacity"):
        attend(cache, 0, queries, slot, offsets, torch.tensor([0, 2, 20]), scale=1.0)
    with pytest.raises(ValueError, match="slot"):
        attend(cache, 0, queries, torch.tensor([7]), offsets, torch.tensor([0, 1, 2]), scale=1.0)


def test_an_unknown_path_is_refused_as_every_kernel_refuses_it(monkeypatch):
    cache = filled_cache(slots=1, layers=1)
    queries, slot = torch.randn(1, 12, 128), torch.tensor([0])
    offsets, cells = torch.tensor([0, 2]), torch.tensor([0, 1])
    monkeypatch.setenv("EXACTSPEC_KERNEL_PATH", "neon")
    with pytest.raises(PathUnavailable, match="unknown kernel path 'neon'"):
        attend(cache, 0, queries, slot, offsets, cells, scale=1.0)
    with pytest.raises(PathUnavailable, match="unknown kernel path 'neon'"):
        rms_norm(torch.ones(1, 8), torch.ones(8), 1e-6)
    monkeypatch.setenv("EXACTSPEC_KERNEL_PATH", "reference")
    forced = attend(cache, 0, queries, slot, offsets, cells, scale=1.0)
    assert torch.equal(forced, attend(cache, 0, queries, slot, offsets, cells, scale=1.0, path="reference"))


def test_calls_from_several_threads_at_once_keep_their_bits():
    from concurrent.futures import ThreadPoolExecutor

    generator = torch.Generator().manual_seed(9)
    cache = filled_cache()
    lists = random_lists(8, cache.capacity, generator)
    queries = torch.randn((8, 12, 128), generator=generator)
    slots = torch.randint(0, cache.slots, (8,), generator=generator)
    offsets, cells = pack(lists)
    expected = attend(cache, 0, queries, slots, offsets, cells, scale=0.1, threads=1)

    def calls(seed: int) -> bool:
        return all(
            torch.equal(
                attend(cache, 0, queries, slots, offsets, cells, scale=0.1, threads=1 + (seed + i) % 3),
                expected,
            )
            for i in range(20)
        )

    with ThreadPoolExecutor(3) as executor:
        assert all(executor.map(calls, range(3)))
