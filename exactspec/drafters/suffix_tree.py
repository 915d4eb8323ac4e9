"""A depth-limited suffix tree with occurrence counts over several token sequences (SuffixDecoding's index).

Semantics first (the trie the tree stands for): for every string s of at most `depth` tokens that
occurs in the held sequences, count(s) is its number of occurrences (start positions i with
seq[i : i + len(s)] == s). The children of s are the tokens t with count(s + t) > 0, so
count(s + t) / sum over t' of count(s + t') estimates P(next token = t | context s) from the text
held. The empty string is the root, with count = the number of tokens held.

Example: the sequence [5, 6, 7, 5, 6, 8] at depth 3 has count((5, 6)) = 2 with children 7 and 8,
count each 1, and count((6,)) = 2.

Storage is path-compressed: a chain of trie nodes each with a single child of the same count is
one edge, whose tokens are read from a held sequence (`seq`, `start`, `length`), so a tree holds
at most about two nodes per token whatever its depth (a trie would hold up to `depth`). The
explicit nodes are the root and every string that branches, ends an occurrence (the end of a
sequence, or `depth` tokens), or has more occurrences than its one continuation: a canonical set,
so an incrementally built tree equals one built from scratch.

Updates: a sequence is *open* while it grows; the tree keeps, for each open sequence, the node
of each of its last `depth` suffixes (its *active* nodes), and appending a token extends each of
them by one: O(depth) dictionary operations per token, independent of the tree's size (the
measured cost: docs/performance.md, "Suffix trees"). A node's (seq, start) always points at the
most recent sequence that added an occurrence to it. Removing sequences in the order they were
added (the oldest first) therefore never leaves a surviving node pointing at a removed sequence:
a node whose latest occurrence was in the oldest sequence has no occurrence in any later one.
That is why `remove` only takes the oldest sequence.
"""

from __future__ import annotations

import heapq
import itertools
import sys
from array import array
from collections import deque
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass


class _Node:
    """An explicit node: the string that ends after its edge, tokens seq[start : start + length]."""

    __slots__ = ("count", "children", "parent", "seq", "start", "length")

    def __init__(self, count: int, parent: _Node | None, seq: int, start: int, length: int) -> None:
        self.count = count  # occurrences of this node's string (and of each string along its edge)
        self.children: dict[int, _Node] | None = None  # first edge token -> child; None for a leaf
        self.parent = parent
        self.seq = seq
        self.start = start
        self.length = length


@dataclass(frozen=True)
class Locus:
    """A string's place in the tree: `offset` tokens into the edge of `node` (offset == node.length: at the
    node itself)."""

    node: _Node
    offset: int


@dataclass(frozen=True)
class Speculation:
    """Draft tokens read from the tree below a locus, as a tree of nodes in topological order.

    parents[n] is node n's parent index (-1: a child of the context). With one branch per node the
    nodes form a chain (parents [-1, 0, 1, ...]). probabilities[n] is the estimated probability of
    node n's whole path (the product of count(child) / count(all children) along it); score is
    their sum, the expected number of tokens accepted if the counts were the truth.
    """

    tokens: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()
    probabilities: tuple[float, ...] = ()

    @property
    def score(self) -> float:
        return sum(self.probabilities)


@dataclass(frozen=True)
class TreeMemory:
    """What a tree holds: tokens (in every sequence it keeps), explicit nodes, and about how many bytes
    (Python objects: nodes, their child dictionaries, the token arrays; measured with sys.getsizeof)."""

    tokens: int
    sequences: int
    nodes: int
    approx_bytes: int


_Candidate = tuple[float, int, _Node, int]
"""A candidate child in `SuffixTree.speculate`: (path probability, token, node, offset into its edge)."""


class SuffixTree:
    """Occurrence counts of every string of at most `depth` tokens in the held sequences (module docstring).

    >>> tree = SuffixTree(depth=3)
    >>> tree.extend(0, [5, 6, 7, 5, 6, 8])
    >>> tree.count([5, 6]), tree.count([6, 7]), tree.count([5, 6, 7, 5])
    (2, 1, 0)
    >>> tree.speculate(tree.locate([5]), max_depth=2).tokens   # after 5: 6 (twice), then 7 or 8 (a tie)
    (6, 7)
    """

    def __init__(self, depth: int) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.depth = depth
        self._root = _Node(0, None, -1, 0, 0)
        self._tokens: dict[int, array] = {}  # sequence id -> its tokens, in the order the sequences came
        self._active: dict[int, deque[_Node]] = {}  # open sequence id -> nodes of its last suffixes
        self._nodes = 1
        self._held = 0

    # ------------------------------------------------------------------ sequences

    @property
    def sequences(self) -> list[int]:
        """Held sequence ids, oldest first."""
        return list(self._tokens)

    def tokens(self, seq: int) -> array:
        """The tokens of sequence `seq` (read only: the tree's edges point into it)."""
        return self._tokens[seq]

    @property
    def tokens_held(self) -> int:
        return self._held

    def extend(self, seq: int, tokens: Iterable[int]) -> None:
        """Append tokens to sequence `seq` (opening it if new): O(depth) per token."""
        if seq not in self._active:
            if seq in self._tokens:
                raise ValueError(f"sequence {seq} is closed; a closed sequence cannot grow")
            self._tokens[seq] = array("i")
            self._active[seq] = deque()
        for token in tokens:
            self._append(seq, int(token))

    def close(self, seq: int) -> None:
        """Sequence `seq` will not grow: forget its active nodes (needed before any `remove`)."""
        self._active.pop(seq, None)

    def add(self, seq: int, tokens: Iterable[int]) -> None:
        """A whole sequence: `extend` then `close`."""
        self.extend(seq, tokens)
        self.close(seq)

    def remove(self, seq: int) -> None:
        """Take the oldest sequence's occurrences out (every count goes back to what it would be without it).

        Only the oldest, and only while no sequence is open: see the module docstring.
        """
        if not self._tokens or next(iter(self._tokens)) != seq:
            raise ValueError(f"only the oldest sequence can be removed; {seq} is not it")
        if self._active:
            raise ValueError("close every sequence before removing one")
        tokens = self._tokens[seq]
        root = self._root
        for begin in range(len(tokens)):
            root.count -= 1
            node, position, end = root, begin, min(len(tokens), begin + self.depth)
            while position < end:
                assert node.children is not None
                key = tokens[position]
                child = node.children[key]
                child.count -= 1
                if child.count == 0:
                    del node.children[key]
                    if not node.children:
                        node.children = None
                    self._nodes -= _subtree_size(child)
                    break
                position += child.length
                node = child
            # Only this node lost an occurrence that ended in it: it may now be a chain link to fold.
            if node is not root and node.children is not None and len(node.children) == 1:
                (only,) = node.children.values()
                if only.count == node.count:
                    parent = node.parent
                    assert parent is not None and parent.children is not None
                    parent.children[self._first(node)] = only
                    only.parent = parent
                    only.start -= node.length
                    only.length += node.length
                    self._nodes -= 1
        self._held -= len(tokens)
        del self._tokens[seq]

    # ------------------------------------------------------------------ queries

    def active_locus(self, seq: int, length: int) -> Locus | None:
        """The open sequence `seq`'s last `length` tokens (1 <= length <= min(depth, its length)), without
        a walk: the tree keeps their node."""
        active = self._active[seq]
        if not 1 <= length <= len(active):
            return None
        node = active[-length]
        return Locus(node, node.length)

    def locate(self, tokens: Iterable[int]) -> Locus | None:
        """Where the string `tokens` is (None if it does not occur): O(len(tokens))."""
        node, offset = self._root, 0
        for token in tokens:
            if offset < node.length:
                if self._tokens[node.seq][node.start + offset] != token:
                    return None
                offset += 1
            else:
                child = node.children.get(token) if node.children is not None else None
                if child is None:
                    return None
                node, offset = child, 1
        return Locus(node, offset)

    def count(self, tokens: Iterable[int]) -> int:
        """Occurrences of the string `tokens` (0 if absent or longer than depth)."""
        locus = self.locate(tokens)
        return 0 if locus is None else locus.node.count

    @staticmethod
    def continues(locus: Locus) -> bool:
        """Some occurrence of the locus' string is followed by a token."""
        return locus.offset < locus.node.length or locus.node.children is not None

    def speculate(
        self,
        locus: Locus,
        max_depth: int,
        *,
        min_probability: float = 0.0,
        max_branches: int = 1,
        max_nodes: int | None = None,
        eos_token_ids: Collection[int] = (),
    ) -> Speculation:
        """The most probable continuations below `locus`: the greedy chain first, then its alternatives.

        A node's candidate children are its `max_branches` most frequent (ties: the smaller token
        id) whose path probability is at least `min_probability`; a node at `max_depth`, or whose
        token is an EOS id, gets no children; at most `max_nodes` nodes (default max_depth).

        The first nodes are the greedy chain: the most frequent child, again and again, while the
        cumulative probability stays at or above min_probability (with max_branches = 1 that is the
        whole speculation). The rest of the budget goes to the other candidates in order of their
        path probability (ties: the one found first). So a tree's first branch is exactly the chain
        that max_branches = 1 drafts within the same budget, and a tree is compared with the chain on
        the same drafts by walking its first branch alone (`verifiers.expected.expected_accepted_tree`).
        """
        budget = max_depth if max_nodes is None else max_nodes
        tokens: list[int] = []
        parents: list[int] = []
        probabilities: list[float] = []
        # Candidates not taken yet: (-path probability, order found, token, parent, depth, node, offset).
        heap: list[tuple[float, int, int, int, int, _Node, int]] = []
        order = itertools.count()

        def candidates(node: _Node, offset: int, probability: float, depth: int) -> list[_Candidate]:
            if depth >= max_depth:
                return []
            return self._candidate_children(node, offset, probability, max_branches, min_probability)

        def take(probability: float, token: int, parent: int) -> int:
            tokens.append(token)
            parents.append(parent)
            probabilities.append(probability)
            return len(tokens) - 1

        def push(found: Sequence[_Candidate], parent: int, depth: int) -> None:
            for probability, token, node, offset in found:
                heapq.heappush(heap, (-probability, next(order), token, parent, depth + 1, node, offset))

        # The greedy chain, its alternatives set aside.
        node, offset, probability, parent, depth = locus.node, locus.offset, 1.0, -1, 0
        while len(tokens) < budget:
            found = candidates(node, offset, probability, depth)
            if not found:
                break
            push(found[1:], parent, depth)
            probability, token, node, offset = found[0]
            parent, depth = take(probability, token, parent), depth + 1
            if token in eos_token_ids:
                break
        # The alternatives, most probable first.
        while heap and len(tokens) < budget:
            negative, _, token, parent, depth, node, offset = heapq.heappop(heap)
            index = take(-negative, token, parent)
            if token not in eos_token_ids:
                push(candidates(node, offset, -negative, depth), index, depth)
        return Speculation(tuple(tokens), tuple(parents), tuple(probabilities))

    def _candidate_children(
        self, node: _Node, offset: int, probability: float, max_branches: int, min_probability: float
    ) -> list[_Candidate]:
        """The candidate children of a place (`node`, `offset` into its edge) whose path probability is
        `probability`: its `max_branches` most frequent (ties: the smaller token id) with a path
        probability of at least `min_probability`, best first."""
        if offset < node.length:  # inside an edge: every occurrence so far continues the same way
            return [(probability, self._tokens[node.seq][node.start + offset], node, offset + 1)]
        children = node.children
        if children is None:
            return []
        total = sum(child.count for child in children.values())
        ranked = heapq.nsmallest(max_branches, children.items(), key=lambda item: (-item[1].count, item[0]))
        found = []
        for token, child in ranked:
            child_probability = probability * child.count / total
            if child_probability < min_probability:
                break
            found.append((child_probability, token, child, 1))
        return found

    def memory(self) -> TreeMemory:
        """Counts and an approximate size in bytes (walks every node: a report, not for a hot loop)."""
        size = sys.getsizeof(self) + sum(sys.getsizeof(tokens) for tokens in self._tokens.values())
        nodes = 0
        stack = [self._root]
        while stack:
            node = stack.pop()
            nodes += 1
            size += sys.getsizeof(node)
            if node.children is not None:
                size += sys.getsizeof(node.children)
                stack.extend(node.children.values())
        size += sum(sys.getsizeof(active) for active in self._active.values())
        return TreeMemory(self._held, len(self._tokens), nodes, size)

    @property
    def nodes(self) -> int:
        """Explicit nodes, the root included (kept up to date, O(1))."""
        return self._nodes

    def trie(self) -> dict[tuple[int, ...], int]:
        """Every string held (up to depth) -> its count, expanded from the compressed edges (for tests)."""
        out: dict[tuple[int, ...], int] = {}
        stack: list[tuple[_Node, tuple[int, ...]]] = [(self._root, ())]
        while stack:
            node, prefix = stack.pop()
            if node is not self._root:
                edge = self._tokens[node.seq][node.start : node.start + node.length]
                for index in range(len(edge)):
                    out[(*prefix, *edge[: index + 1])] = node.count
                prefix = (*prefix, *edge)
            for child in (node.children or {}).values():
                stack.append((child, prefix))
        return out

    def explicit_nodes(self) -> dict[tuple[int, ...], int]:
        """The explicit (non-root) nodes' strings -> counts: the compressed shape, for tests."""
        out: dict[tuple[int, ...], int] = {}
        stack: list[tuple[_Node, tuple[int, ...]]] = [(self._root, ())]
        while stack:
            node, prefix = stack.pop()
            if node is not self._root:
                prefix = (*prefix, *self._tokens[node.seq][node.start : node.start + node.length])
                out[prefix] = node.count
            for child in (node.children or {}).values():
                stack.append((child, prefix))
        return out

    # ------------------------------------------------------------------ internals

    def _first(self, node: _Node) -> int:
        return self._tokens[node.seq][node.start]

    def _append(self, seq: int, token: int) -> None:
        """Extend each active suffix of `seq` by `token` (and start the new one-token suffix)."""
        tokens = self._tokens[seq]
        active = self._active[seq]
        tokens.append(token)
        self._held += 1
        position = len(tokens) - 1
        root = self._root
        root.count += 1
        active.append(root)
        if len(active) > self.depth:
            active.popleft()  # that suffix reached `depth` tokens last time: it stops there
        for index, node in enumerate(active):
            # The suffix at `node` ends at position - 1, is counted in node.count, and ends in `node`.
            children = node.children
            child = children.get(token) if children is not None else None
            if child is None:
                if node is not root and node.count == 1:
                    node.length += 1  # a leaf only this suffix reached: its edge grows (it points here)
                else:
                    leaf = _Node(1, node, seq, position, 1)
                    if children is None:
                        node.children = {token: leaf}
                    else:
                        children[token] = leaf
                    active[index] = leaf
                    self._nodes += 1
            elif node is not root and node.count == child.count + 1:
                # Every other occurrence of this string already continues with `token`; so does this one
                # now: the node stops being a branch point and becomes part of the edge.
                assert children is not None
                if child.length == 1:  # the child takes the node's place, its edge one longer
                    parent = node.parent
                    assert parent is not None and parent.children is not None
                    parent.children[self._first(node)] = child
                    child.parent = parent
                    child.count += 1
                    child.length = node.length + 1
                    child.seq, child.start = seq, position - node.length
                    active[index] = child
                    self._nodes -= 1
                else:  # the node moves one token down into the child's edge
                    del children[token]
                    child.start += 1
                    child.length -= 1
                    children[self._first(child)] = child
                    node.length += 1
                    node.seq, node.start = seq, position - node.length + 1
            elif child.length == 1:
                child.count += 1
                child.seq, child.start = seq, position
                active[index] = child
            else:  # split the child's edge after its first token
                assert children is not None
                middle = _Node(child.count + 1, node, seq, position, 1)
                child.start += 1
                child.length -= 1
                child.parent = middle
                middle.children = {self._first(child): child}
                children[token] = middle
                active[index] = middle
                self._nodes += 1


def _subtree_size(node: _Node) -> int:
    size = 0
    stack = [node]
    while stack:
        current = stack.pop()
        size += 1
        if current.children is not None:
            stack.extend(current.children.values())
    return size
