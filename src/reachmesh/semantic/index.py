"""``semantic_route``: find the declared task nearest in meaning to the caller's text.

Capability texts (the task name, its description, and each of its ``examples``) are embedded
once, at registration. Each row is stored twice: as float16 (exact enough to score with) and as
int8 codes with a per-row scale. A query first scans the int8 codes with a SIMD kernel
(``numkong``) to find the few rows worth scoring, then scores only those tasks' rows from the
float16 copy. At 20,000 rows the int8 scan reads 7.7 MB instead of the 30 MB a float32
matrix-vector product reads, which is what made the cached-query decision memory-bound; the
final scores do not depend on the int8 rounding, only the choice of rows to look at does.
Rows are keyed by (task, text), so a thousand agents declaring the same capability share one
row. A route is taken only when the best task scores at least the threshold *and*
beats the runner-up task by the margin: refusing beats guessing wrong.

Cosine scores differ a lot between models (e5 puts nearly everything between 0.77 and 0.93), so
thresholds are per model: each embedder carries its calibrated ones (``reach calibrate``), and
the policy may override them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numkong
import numpy as np
import numpy.typing as npt

from reachmesh.semantic.head import Head

Vector = npt.NDArray[np.float32]

# Rows a learned phrase brings are held by a pseudo-agent named with this prefix (no agent id can
# start with a NUL). They count as examples of their task, but never make a task routable alone:
# a task only learned rows hold (its agents left) is not scored at all.
LEARNED = "\x00learned:"

# A capability's declared limits are rows of a pseudo-task named with this prefix, kept in an index
# of their own beside the capabilities' (so the scan of every query never reads them): never
# scored as a task, only matched with a text beside their own capability (SemanticIndex.limit_hits).
LIMIT = "\x00limit:"

# Rows the int8 scan hands to exact scoring, at least. The int8 error on a cosine is about 0.001
# (per-row scales); the best rows of the best tasks stand well inside the first 64.
SHORTLIST = 64


def quantise(vectors: Vector) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.float32]]:
    """Rows as int8 codes and a scale each, so that ``row ~= codes * scale`` (zero rows: scale 0)."""
    peak = np.abs(vectors).max(axis=1)
    scale = np.where(peak > 0, peak / 127.0, 0.0).astype(np.float32)
    safe = np.where(scale > 0, scale, 1.0)[:, None]
    codes = np.clip(np.rint(vectors / safe), -127, 127).astype(np.int8)
    return codes, scale


# Each task's score is the mean of its best TOP_K rows (its description and examples), so one
# lucky example does not carry a task, and a task with many examples is not penalised.
TOP_K = 3

# Neutral sentences, in both languages the demo speaks. A query's mean similarity to them is its
# background level: e5 rates every pair of texts 0.75-0.9, and how high depends on the query, so
# scores are taken relative to that level. Never tuned against the labelled phrases.
BACKGROUND = [
    "The museum opens at nine in the morning.",
    "这本书讲述了一个家族的历史。",
    "She planted tomatoes in the garden last spring.",
    "会议室在三楼的走廊尽头。",
    "The river flows through the old town.",
    "他每天早上跑步五公里。",
    "A new bridge was built across the bay.",
    "这家咖啡店的音乐很安静。",
    "The cat is sleeping on the sofa.",
    "孩子们在公园里放风筝。",
    "The train leaves from platform four.",
    "山顶上的风景非常美。",
    "Our team finished the project ahead of schedule.",
    "图书馆周末也开放。",
    "The lecture covered the basics of chemistry.",
    "他把钥匙忘在了办公室。",
    "Autumn leaves covered the sidewalk.",
    "这部电影改编自一本小说。",
    "The restaurant serves breakfast all day.",
    "我们计划明年去海边度假。",
    "Please close the window when you leave.",
    "这座城市有很多古老的寺庙。",
    "The orchestra rehearsed for the concert.",
    "她正在学习弹钢琴。",
    "Traffic was heavy on the highway this morning.",
    "实验结果发表在期刊上。",
    "The children built a sandcastle on the beach.",
    "这条街上新开了一家面包店。",
    "He repaired the old bicycle himself.",
    "月亮今晚特别圆。",
]


def capability_texts(task: str, description: str, examples: list[str]) -> list[str]:
    """The texts that stand for one capability: ``"task words: description"``, the task words
    alone, and each example.

    The task words get a row of their own because a short name ("parcel track") is often closer
    to a terse question than a full sentence is: on the calibration half of the evaluation corpus
    this view lifted the description-only top-1 from 46.5% to 53.5% (docs/semantic-eval.md).
    """
    words = task.replace("_", " ").replace(".", " ").strip()
    if not description:
        return [words, *examples]
    return [f"{words}: {description}", words, *examples]


def limit_rows(task: str, limits: list[str]) -> tuple[str, list[str]]:
    """The pseudo-task and texts under which ``task``'s declared limits are indexed."""
    return LIMIT + task, list(limits)


def language_means(background: Vector) -> Vector:
    """The mean vector of each language of :data:`BACKGROUND` (it alternates English and
    Chinese): what a text shares with every other text of its language, whatever it says."""
    means: Vector = np.stack([background[0::2].mean(axis=0), background[1::2].mean(axis=0)])
    return means.astype(np.float32)


def _centred(vectors: Vector, languages: Vector) -> Vector:
    """Unit rows less the mean of the language each is nearest to (a text in a language the
    background lacks loses the nearest one's: still most of what all texts share)."""
    nearest = np.argmax(vectors @ languages.T, axis=1)
    out: Vector = vectors - languages[nearest]
    out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)
    return out


def limit_basis(limits: Vector, task_rows: Vector, languages: Vector) -> tuple[Vector, Vector]:
    """A task's direction (its rows' mean, each row without its language) and what is left of
    each of its limit rows once their language and that direction are taken out (unit rows)."""
    centre = _centred(task_rows, languages).mean(axis=0)
    centre /= max(float(np.linalg.norm(centre)), 1e-9)
    left = _centred(limits, languages)
    left -= np.outer(left @ centre, centre)
    left /= np.maximum(np.linalg.norm(left, axis=1, keepdims=True), 1e-9)
    return centre.astype(np.float32), left.astype(np.float32)


def limit_residuals(query: Vector, basis: tuple[Vector, Vector], languages: Vector) -> Vector:
    """The cosine between what is left of ``query`` (without its language and the task's
    direction) and each limit row's residual (:func:`limit_basis`)."""
    centre, left = basis
    text = _centred(query[None, :], languages)[0]
    text -= float(text @ centre) * centre
    text /= max(float(np.linalg.norm(text)), 1e-9)
    values: Vector = left @ text
    return values


# How close to the nearest task (in score) a task must be for the few-shot head to choose it.
HEAD_REACH = 0.02

# A trained few-shot head, the margin (difference of probabilities among the nearest tasks) its
# own choice needs, and its confidence: the least probability, over all its classes, it must give
# the chosen task whenever it covers that task, whoever chose it (the head or similarity alone).
HeadRule = tuple[Head, float, float]

# (task, its score) -> None to keep it, or (reason, the declared limit hit or None) to set it aside.
Veto = Callable[[str, float], "tuple[str, str | None] | None"]


@dataclass(slots=True, frozen=True)
class Verdict:
    """The outcome of a semantic match."""

    task: str | None  # the chosen task, or None when refused
    score: float
    runner_up: float | None
    reason: str  # "match", "below_threshold" or "ambiguous"
    best: list[tuple[str, float]]  # the top tasks with their scores, best first
    # Tasks set aside before judging (a declared limit, a learned negative): task, score,
    # reason, and the limit it hit.
    vetoed: list[tuple[str, float, str, str | None]] = field(default_factory=list)
    # When the few-shot head chose: how much more probable it found the task than the runner-up.
    head_gap: float | None = None
    # When the head covers the task chosen: its probability for it, over all its classes.
    head_p: float | None = None


class SemanticIndex:
    """Unit vectors of capability texts, keyed by (task, text), shared by every agent declaring them."""

    def __init__(self, dim: int = 384, capacity: int = 1024) -> None:
        self.dim = dim
        self._limits: SemanticIndex | None = None  # the declared limits' rows, once any arrive
        self._allocate(capacity)
        self._size = 0
        self._row: dict[tuple[str, str], int] = {}
        self._task_of: list[str | None] = []
        self._key_of: list[tuple[str, str] | None] = []
        self._task_rows: dict[str, set[int]] = {}
        self._users: dict[int, set[str]] = {}  # row -> agents using it
        self._agent_rows: dict[str, list[int]] = {}
        self._task_agents: dict[str, set[str]] = {}  # task -> agents (not learned rows) declaring it
        self._free: list[int] = []
        # Bumped whenever a task's rows change: the few-shot head is retrained when it moves.
        self.generation = 0
        # language_means() of the background, which declared limits are judged without (None
        # until the background is embedded: limits are then judged on the vectors as they are).
        self.languages: Vector | None = None
        self._no_languages: Vector = np.zeros((1, dim), dtype=np.float32)
        # Per task with limits: limit_basis() and the state it was computed on (the languages by
        # identity: both arrays above live as long as the index, so no id is reused).
        self._bases: dict[str, tuple[tuple[int, int, int, int], tuple[Vector, Vector]]] = {}

    def _allocate(self, capacity: int) -> None:
        self._store: npt.NDArray[np.float16] = np.zeros((capacity, self.dim), dtype=np.float16)
        self._codes: npt.NDArray[np.int8] = np.zeros((capacity, self.dim), dtype=np.int8)
        self._scales: Vector = np.zeros(capacity, dtype=np.float32)

    def __len__(self) -> int:
        return len(self._row)

    def has(self, task: str, text: str) -> bool:
        if task.startswith(LIMIT) and self._limits is not None:
            return self._limits.has(task, text)
        return (task, text) in self._row

    def vector(self, task: str, text: str) -> Vector:
        """The stored unit vector of one (task, text) row."""
        if task.startswith(LIMIT) and self._limits is not None:
            return self._limits.vector(task, text)
        row: Vector = self._store[self._row[(task, text)]].astype(np.float32)
        return row

    def add(self, agent_id: str, task: str, texts: list[str], vectors: Vector) -> None:
        """Index an agent's capability texts (vectors must be unit rows, one per text)."""
        if task.startswith(LIMIT):
            if self._limits is None:
                self._limits = SemanticIndex(dim=int(vectors.shape[1]), capacity=64)
            self._limits.add_rows(agent_id, task, texts, vectors)
            return
        self.add_rows(agent_id, task, texts, vectors)

    def add_rows(self, agent_id: str, task: str, texts: list[str], vectors: Vector) -> None:
        """Index rows here, whatever their task (the limits' own index takes them this way)."""
        if vectors.shape[1] != self.dim:
            if self._size == 0 and not self._row:
                self.dim = int(vectors.shape[1])
                self._allocate(self._store.shape[0])
                self._no_languages = np.zeros((1, self.dim), dtype=np.float32)
            else:
                raise ValueError(f"vectors of dimension {vectors.shape[1]} in an index of {self.dim}")
        rows = self._agent_rows.setdefault(agent_id, [])
        self.generation += 1  # rows, or the agents that make a task routable, change
        if not agent_id.startswith(LEARNED) and not task.startswith(LIMIT):
            self._task_agents.setdefault(task, set()).add(agent_id)
        for text, vector in zip(texts, vectors, strict=True):
            key = (task, text)
            row = self._row.get(key)
            if row is None:
                row = self._free.pop() if self._free else self._grow()
                self._put(row, vector)
                self._row[key] = row
                self._task_of[row] = task
                self._key_of[row] = key
                self._task_rows.setdefault(task, set()).add(row)
            users = self._users.setdefault(row, set())
            if agent_id not in users:
                users.add(agent_id)
                rows.append(row)

    def _put(self, row: int, vector: Vector) -> None:
        self._store[row] = vector
        codes, scale = quantise(vector[None, :])
        self._codes[row] = codes[0]
        self._scales[row] = scale[0]

    def _grow(self) -> int:
        if self._size == self._store.shape[0]:
            store, codes, scales = self._store, self._codes, self._scales
            self._allocate(store.shape[0] * 2)
            self._store[: self._size] = store[: self._size]
            self._codes[: self._size] = codes[: self._size]
            self._scales[: self._size] = scales[: self._size]
        self._task_of.append(None)
        self._key_of.append(None)
        self._size += 1
        return self._size - 1

    def remove_agent(self, agent_id: str) -> None:
        """Forget an agent; rows no other agent uses are zeroed and reused."""
        if self._limits is not None:
            self._limits.remove_agent(agent_id)
        rows = self._agent_rows.pop(agent_id, None)
        if rows is None:
            return
        self.generation += 1
        for row in rows:
            users = self._users.get(row)
            if users is None:
                continue
            key = self._key_of[row]
            if key is not None and key[0] in self._task_agents:
                agents = self._task_agents[key[0]]
                agents.discard(agent_id)
                if not agents:
                    del self._task_agents[key[0]]
            users.discard(agent_id)
            if not users:
                del self._users[row]
                self._release(row)

    def _release(self, row: int) -> None:
        """Zero a row no agent uses any more and keep it for reuse."""
        key = self._key_of[row]
        if key is not None:
            del self._row[key]
            task_rows = self._task_rows.get(key[0])
            if task_rows is not None:
                task_rows.discard(row)
                if not task_rows:
                    del self._task_rows[key[0]]
        self._key_of[row] = None
        self._task_of[row] = None
        self._put(row, np.zeros(self.dim, dtype=np.float32))
        self._free.append(row)

    def task_matrices(self) -> dict[str, Vector]:
        """Every routable task's rows (learned ones included), as float32 copies: what the
        few-shot head trains on, safe to read from another thread."""
        return {
            task: self._store[sorted(rows)].astype(np.float32)
            for task, rows in self._task_rows.items()
            if task in self._task_agents
        }

    def nearest(self, query: Vector, k: int = 3, baseline: float = 0.0) -> list[tuple[str, float]]:
        """The ``k`` best tasks with their scores, best first.

        A task's score is the mean of its best :data:`TOP_K` rows, minus ``baseline``.
        """
        if self._size == 0:
            return []
        # The best rows by the int8 scan point at the few tasks worth scoring exactly.
        codes, _ = quantise(query[None, :].astype(np.float32))
        dots = np.asarray(numkong.cdist(codes, self._codes[: self._size], metric="dot"))[0]
        approx = dots * self._scales[: self._size]
        top = min(self._size, max(SHORTLIST, k * TOP_K * 4))
        index = np.argpartition(-approx, top - 1)[:top] if top < self._size else np.arange(self._size)
        seen: list[str] = []
        for row in index[np.argsort(-approx[index])]:
            task = self._task_of[row]
            if task is not None and task not in seen and task in self._task_agents:
                seen.append(task)
                if len(seen) == k * 2:
                    break
        rated = []
        for task in seen:
            rows = self._task_rows.get(task)
            if not rows:
                continue
            values = self._store[list(rows)].astype(np.float32) @ query
            best = np.partition(-values, min(TOP_K, len(values)) - 1)[: min(TOP_K, len(values))]
            rated.append((task, float(-best.mean()) - baseline))
        rated.sort(key=lambda item: -item[1])
        return rated[:k]

    def _limit_basis(self, task: str, order: list[int], languages: Vector) -> tuple[Vector, Vector]:
        """:func:`limit_basis` of ``task``, kept until its rows, its limits or the languages
        change: a request pays for one query's residual, not for every row's."""
        limits = self._limits
        assert limits is not None
        key = (self.generation, limits.generation, id(languages), len(order))
        known = self._bases.get(task)
        if known is not None and known[0] == key:
            return known[1]
        mine = self._store[sorted(self._task_rows[task])].astype(np.float32)
        basis = limit_basis(limits._store[order].astype(np.float32), mine, languages)
        if len(self._bases) >= 4096:  # a bound, not an eviction policy: all are rebuilt cheaply
            self._bases.clear()
        self._bases[task] = (key, basis)
        return basis

    def limit_hit(
        self, query: Vector, task: str, languages: Vector | None = None
    ) -> tuple[float, str] | None:
        """How well ``query`` matches ``task``'s declared limits beyond what the task itself
        explains (:meth:`limit_hits`), and the limit; None when the task declares none."""
        hits = self.limit_hits(query, task, languages)
        return max(hits.values()) if hits else None

    def limit_hits(
        self, query: Vector, task: str, languages: Vector | None = None
    ) -> dict[str, tuple[float, str]]:
        """Each agent declaring limits on ``task``: how well ``query`` matches its own limits
        beyond what ``task`` explains, and the limit it matches best. One agent's limits speak
        for that agent alone.

        The match is a cosine of residuals (:func:`limit_residuals`): the query, the limits and
        the task's rows each lose their language's mean (``languages``, else the index's own),
        then the direction of the task's mean row. What is left of "I want a refund for my
        order" beside order tracking is the refund, and it points where the residual of
        "refunds and returns" does; what is left of "where is my order 1234" points nowhere in
        particular. Comparing raw
        scores instead (limit minus task) let a capability whose examples say "my order" keep
        the refund, and let a Chinese limit take a Chinese question about an English
        capability by language alone (docs/semantic-eval.md, issue 41)."""
        limits = self._limits
        rows = None if limits is None else limits._task_rows.get(LIMIT + task)
        own = self._task_rows.get(task)
        if not rows or not own:
            return {}
        assert limits is not None
        order = list(rows)
        if languages is None:
            languages = self.languages if self.languages is not None else self._no_languages
        values = limit_residuals(query, self._limit_basis(task, order, languages), languages)
        hits: dict[str, tuple[float, str]] = {}
        for row, value in zip(order, values, strict=True):
            key = limits._key_of[row]
            if key is None:
                continue
            for agent_id in limits._users.get(row, ()):
                known = hits.get(agent_id)
                if known is None or float(value) > known[0]:
                    hits[agent_id] = (float(value), key[1])
        return hits

    def close_tasks(self, rows: Vector, similarity: float) -> dict[str, tuple[int, float]]:
        """For each declared task with a row at ``similarity`` or closer to some of ``rows``: how
        many of ``rows`` have one, and the closest cosine. One product over the index: the cost
        of checking a new capability against every other (docs/security.md, near-duplicates)."""
        if self._size == 0 or len(rows) == 0:
            return {}
        sims = rows.astype(np.float32) @ self._store[: self._size].astype(np.float32).T
        found: dict[str, tuple[int, float]] = {}
        for values in sims:
            best: dict[str, float] = {}
            for col in np.flatnonzero(values >= similarity):
                task = self._task_of[int(col)]
                if task is not None and task in self._task_agents:
                    best[task] = max(best.get(task, -1.0), float(values[col]))
            for task, value in best.items():
                count, closest = found.get(task, (0, -1.0))
                found[task] = (count + 1, max(closest, value))
        return found

    def declaring(self, task: str) -> set[str]:
        """The agents (not learned rows) whose capability texts are indexed for ``task``."""
        return set(self._task_agents.get(task, ()))

    def task_score(self, query: Vector, task: str, baseline: float = 0.0) -> float | None:
        """``task``'s score for ``query`` as :meth:`nearest` rates it; None for a task with no rows."""
        rows = self._task_rows.get(task)
        if not rows:
            return None
        values = self._store[list(rows)].astype(np.float32) @ query
        top = min(TOP_K, len(values))
        return float(np.partition(values, len(values) - top)[len(values) - top :].mean()) - baseline

    def judge(
        self,
        query: Vector,
        threshold: float,
        margin: float,
        baseline: float = 0.0,
        veto: Veto | None = None,
        head: HeadRule | None = None,
    ) -> Verdict:
        """Pick a task, or refuse: below the threshold, or too close to the runner-up. Tasks
        ``veto`` sets aside are neither picked nor anyone's runner-up. With a few-shot ``head``
        that covers the nearest task, the head chooses among the tasks it covers and the
        chosen task's own score must clear the threshold (see :meth:`_by_head`)."""
        best, vetoed = self._kept(query, baseline, veto)
        verdict = None
        if head is not None and len(best) > 1 and head[0].covers(best[0][0]):
            verdict = self._by_head(threshold, query, head, best)
        if verdict is None:
            verdict = self._judged(best, threshold, margin)
        if head is not None:
            verdict = self._confident(verdict, query, head, {task for task, *_ in vetoed})
        if vetoed:
            return replace(verdict, vetoed=vetoed)
        return verdict

    @staticmethod
    def _confident(verdict: Verdict, query: Vector, head: HeadRule, aside: set[str]) -> Verdict:
        """``verdict`` with the head's probability for its task (over all the head's classes but
        the tasks set ``aside``) when the head covers it, refused ("below_threshold") when that
        is under ``head[2]``.

        Similarity relative to the background tells a banking question from small talk, but not
        from a banking question no capability serves: those sit as near the capabilities as the
        ones they serve. The head, trained to tell the capabilities apart, spreads its
        probability over several of them for such a question; on Banking77 and CLINC150's
        validation phrases this refused far more of them at the same wrong-route budget than
        the threshold could (docs/semantic-eval.md)."""
        task = verdict.best[0][0] if verdict.best else None
        model = head[0]
        if task is None or not model.covers(task):
            return verdict
        p = model.probability(query, task, aside)
        if verdict.task is not None and p < head[2]:
            return replace(verdict, task=None, reason="below_threshold", head_p=p)
        return replace(verdict, head_p=p)

    @staticmethod
    def _by_head(
        threshold: float, query: Vector, head: HeadRule, best: list[tuple[str, float]]
    ) -> Verdict | None:
        """The head's choice among the nearest tasks within HEAD_REACH of the nearest one: taken
        when its own score clears the threshold and the head prefers it to the runner-up among
        them by ``head[1]`` (a difference of probabilities). None when fewer than two of them
        are the head's: similarity alone decides then.

        Similarity shortlists, the head orders the shortlist: a head trained on a few classes
        has opinions about any text, and left free it would pick a task far from the text."""
        model, head_margin = head[0], head[1]
        top = best[0][1]
        near = {task for task, score in best if top - score <= HEAD_REACH and model.covers(task)}
        pick = model.pick(query, near.__contains__) if len(near) > 1 else None
        if pick is None:
            return None
        task, first, second = pick
        score = dict(best)[task]
        ranked = [(task, score), *[(t, s) for t, s in best if t != task]]
        runner_up = ranked[1][1]
        gap = first - second
        if score < threshold:
            return Verdict(None, score, runner_up, "below_threshold", ranked, head_gap=gap)
        if gap < head_margin:
            return Verdict(None, score, runner_up, "ambiguous", ranked, head_gap=gap)
        return Verdict(task, score, runner_up, "match", ranked, head_gap=gap)

    def _kept(
        self, query: Vector, baseline: float, veto: Veto | None
    ) -> tuple[list[tuple[str, float]], list[tuple[str, float, str, str | None]]]:
        """The three nearest tasks ``veto`` keeps, and the ones it set aside."""
        best = self.nearest(query, 3, baseline)
        vetoed: list[tuple[str, float, str, str | None]] = []
        if veto is not None:
            verdicts = {task: veto(task, score) for task, score in best}
            if any(verdicts.values()):
                # Some of the three are set aside: look further for the ones that stand in.
                best = self.nearest(query, 6, baseline)
            kept = []
            for task, score in best:
                why = verdicts[task] if task in verdicts else veto(task, score)
                if why is None:
                    kept.append((task, score))
                else:
                    vetoed.append((task, score, why[0], why[1]))
            best = kept[:3]
        return best, vetoed

    @staticmethod
    def _judged(best: list[tuple[str, float]], threshold: float, margin: float) -> Verdict:
        if not best:
            return Verdict(None, 0.0, None, "below_threshold", [])
        task, score = best[0]
        runner_up = best[1][1] if len(best) > 1 else None
        if score < threshold:
            return Verdict(None, score, runner_up, "below_threshold", best)
        if runner_up is not None and score - runner_up < margin:
            return Verdict(None, score, runner_up, "ambiguous", best)
        return Verdict(task, score, runner_up, "match", best)

    def memory_bytes(self) -> int:
        own = int(self._store.nbytes + self._codes.nbytes + self._scales.nbytes)
        return own + (self._limits.memory_bytes() if self._limits is not None else 0)


class QueryCache:
    """Request-side vectors by text, least recently used first out."""

    def __init__(self, size: int = 10_000) -> None:
        self.size = size
        self._vectors: OrderedDict[str, Vector] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, text: str) -> Vector | None:
        vector = self._vectors.get(text)
        if vector is None:
            self.misses += 1
            return None
        self._vectors.move_to_end(text)
        self.hits += 1
        return vector

    def put(self, text: str, vector: Vector) -> None:
        if self.size <= 0:
            return
        self._vectors[text] = vector
        self._vectors.move_to_end(text)
        while len(self._vectors) > self.size:
            self._vectors.popitem(last=False)

    def __len__(self) -> int:
        return len(self._vectors)
