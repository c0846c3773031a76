"""CMU motion capture (Acclaim ASF/AMC) → 3D joint positions → fixed-length walking tracks.

The paper's Mocap data set consists "of 48 skeletal tracks from three human subjects collected while they were
walking. The tracks have 300 timesteps each, and are from a Vicon motion capture system. [...] Features consist of
the 3D positions of the skeletal parts (e.g., upper back, thorax, clavicle)." It does not name the CMU
trials. This module implements, with numpy only (no ``pyacclaim``):

* :func:`parse_asf` — the skeleton file (bone directions, lengths, local axes, degrees of freedom, hierarchy);
* :func:`parse_amc` — the motion file, **all** frames (``pyacclaim.loadAMC`` silently drops the last one);
* :func:`forward_kinematics` — joint positions in inches, vectorised over frames, using the convention checked in
  ``shared/data/mocap/PROVENANCE.md``: for a bone, ``G = G_parent · C · M · C⁻¹`` with ``C`` the bone's ``axis``
  rotation (``C = Rz(az)·Ry(ay)·Rx(ax)`` for ``axis … XYZ``) and ``M`` the product of its dof rotations applied in
  listed order (``M = Rz·Ry·Rx`` for ``dof rx ry rz``); bone end = bone start + ``G · direction · length / 0.45``;
  the root sits at ``translation / 0.45`` and is rotated per the ASF root ``order``. Y is up, 120 frames per second;
* :func:`prepare_mocap` — cut 300-frame tracks, split by trial, standardise with train statistics.

Data gap
--------
The read-only mirror ``shared/data/mocap`` holds only **7 walking trials of 3 subjects** (07_01 316 frames, 07_02
329, 07_09 306, 07_10 301, 07_11 315, 16_15 471, 35_01 358; 2,396 frames). 48 disjoint 300-frame tracks need 14,400
frames, so with the mirror the 40 train / 8 test tracks necessarily overlap within their split; train and test never
share a trial. A trial of ``T`` frames has only ``T - 299`` distinct 300-frame windows (07_10: 2), so tracks are
shared among a split's trials proportionally to length but never beyond a trial's distinct windows: no two tracks
of a split are identical, and a split whose trials hold fewer distinct windows than requested gets fewer tracks
(with a warning). ``meta["splits"]`` records, per split, the tracks made, the distinct frames they cover, whether
they overlap and the smallest shift between two of them. With the mirror and the two test trials params.yaml names
(``test_trials``), the 8 test tracks are shifted copies of two walks (645 distinct frames); left to
:func:`_choose_test_trials` (``test_trials: null``), the held-out trials depend on the seed, one trial (316 frames)
or two (600-620). A user with internet access can
download more CMU walking trials (e.g. 07_03–07_08, 07_12, 08_01–08_11, 35_02–35_16 from
``http://mocap.cs.cmu.edu/subjects/NN/``) into ``raw_dir/cmu/<subject>/`` and name them in ``trials=[...]`` to get
48 disjoint tracks from the same code.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from pipeline.data.schema import SequenceDataset
from pipeline.messages import brief_list

log = logging.getLogger(__name__)

#: The mirror's walking trials (subject_trial), the default for :func:`prepare_mocap`.
DEFAULT_TRIALS: tuple[str, ...] = ("07_01", "07_02", "07_09", "07_10", "07_11", "16_15", "35_01")

#: Default bones whose end points become features: spine, neck/head, shoulder girdle, arms and legs. Includes the
#: paper's examples (upper back, thorax, clavicles); hands/fingers/toes are left out (small, noisy markers).
DEFAULT_BONES: tuple[str, ...] = (
    "lowerback", "upperback", "thorax", "lowerneck", "head",
    "lclavicle", "rclavicle", "lhumerus", "rhumerus", "lradius", "rradius",
    "lfemur", "rfemur", "ltibia", "rtibia", "lfoot", "rfoot",
)  # fmt: skip

#: CMU capture rate.
FRAME_RATE_HZ = 120.0

_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?inf"


class MocapFileError(ValueError):
    """Malformed ASF/AMC input; the message names the file and, where known, the line."""


class MissingMocapFileError(FileNotFoundError, ValueError):
    """A requested ASF/AMC file does not exist (both a ``FileNotFoundError`` and a ``ValueError``)."""


# ----------------------------------------------------------------------------------------------------------- ASF


@dataclass
class Bone:
    """One ASF bone. Lengths are in ASF units (divide by :attr:`Skeleton.length_unit` for inches)."""

    name: str
    direction: np.ndarray  # (3,) unit vector in the global frame of the rest pose
    length: float  # ASF units
    axis: np.ndarray  # (3,) local-axis Euler angles in radians, in the order of ``axis_order``
    axis_order: str  # e.g. "XYZ": C = Rz·Ry·Rx (rotations applied in listed order)
    dof: tuple[str, ...] = ()  # subset of rx, ry, rz (and possibly tx, ty, tz, l), lower case, in listed order
    limits: list[tuple[float, float]] = field(default_factory=list)
    id: int | None = None


@dataclass
class Skeleton:
    """A parsed ASF skeleton.

    ``bones`` keeps the ``:bonedata`` order; ``parent`` maps every bone to its parent (``"root"`` for the top
    level); ``length_unit`` is the ``:units length`` factor (0.45 for CMU: ASF length / 0.45 = inches).
    """

    path: Path
    name: str
    length_unit: float
    angle_unit: str  # "deg" or "rad"; applies to ASF axes and AMC rotations
    root_order: tuple[str, ...]  # e.g. ("tx", "ty", "tz", "rx", "ry", "rz")
    root_axis: str  # e.g. "XYZ"
    root_position: np.ndarray
    root_orientation: np.ndarray  # radians
    bones: dict[str, Bone]
    parent: dict[str, str]

    @property
    def bone_names(self) -> list[str]:
        """``["root", *bones in :bonedata order]`` — the order of :func:`forward_kinematics` output."""
        return ["root", *self.bones]

    def children(self, name: str) -> list[str]:
        return [b for b in self.bones if self.parent[b] == name]

    def topological_order(self) -> list[str]:
        """Bones (without root) ordered so that every parent precedes its children."""
        order: list[str] = []
        frontier = ["root"]
        while frontier:
            nxt: list[str] = []
            for p in frontier:
                kids = self.children(p)
                order.extend(kids)
                nxt.extend(kids)
            frontier = nxt
        return order


def _read_lines(path: Path) -> list[str]:
    """Read a text file with CRLF or LF endings (universal newlines); errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise MissingMocapFileError(f"{path}: file not found")
    try:
        return path.read_text(encoding="latin-1").splitlines()
    except OSError as exc:
        raise MocapFileError(f"{path}: cannot read ({exc})") from None


def _floats(tokens: Sequence[str], path: Path, lineno: int, what: str) -> np.ndarray:
    try:
        return np.array([float(t) for t in tokens], dtype=np.float64)
    except ValueError:
        raise MocapFileError(f"{path}:{lineno}: {what}: expected numbers, got {' '.join(tokens)!r}") from None


def parse_asf(path: str | Path) -> Skeleton:
    """Parse an Acclaim skeleton file (``.asf``).

    Reads ``:units`` (``length``, ``angle``), ``:root`` (``order``, ``axis``, ``position``, ``orientation``),
    ``:bonedata`` (``name``, ``direction``, ``length``, ``axis``, ``dof``, ``limits``) and ``:hierarchy``.
    Angles are converted to radians. Raises :class:`MocapFileError` naming the file and line on malformed input.
    """
    path = Path(path)
    lines = _read_lines(path)
    units: dict[str, str] = {}
    root: dict[str, list[str]] = {}
    raw_bones: list[tuple[int, dict[str, list[str]], list[tuple[int, str]]]] = []  # (line, fields, limit lines)
    hierarchy: list[tuple[int, list[str]]] = []
    name = ""
    section = ""
    bone: dict[str, list[str]] | None = None
    bone_line = 0
    limit_lines: list[tuple[int, str]] = []
    in_limits = False
    in_hier_block = False
    for lineno, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith(":"):
            if bone is not None:
                raise MocapFileError(f"{path}:{bone_line}: bone block has no 'end' before {line.split()[0]}")
            head, *rest = line.split(None, 1)
            section = head[1:].lower()
            if section == "name" and rest:
                name = rest[0].strip()
            continue
        tokens = line.split()
        key = tokens[0].lower()
        if section == "units":
            if len(tokens) < 2:
                raise MocapFileError(f"{path}:{lineno}: ':units' entry needs a value: {line!r}")
            units[key] = tokens[1]
        elif section == "root":
            root[key] = tokens[1:]
        elif section == "bonedata":
            if key == "begin":
                if bone is not None:
                    raise MocapFileError(f"{path}:{lineno}: 'begin' inside the bone block opened at line {bone_line}")
                bone, bone_line, limit_lines, in_limits = {}, lineno, [], False
            elif bone is None:
                raise MocapFileError(f"{path}:{lineno}: {line!r} outside a begin/end bone block")
            elif key == "end":
                raw_bones.append((bone_line, bone, limit_lines))
                bone = None
            elif key == "limits":
                in_limits = True
                limit_lines.append((lineno, line[len(tokens[0]) :]))
            elif line.startswith("(") and in_limits:
                limit_lines.append((lineno, line))
            else:
                in_limits = False
                bone[key] = tokens[1:]
        elif section == "hierarchy":
            if key == "begin":
                in_hier_block = True
            elif key == "end":
                in_hier_block = False
            elif not in_hier_block:
                raise MocapFileError(f"{path}:{lineno}: hierarchy entry outside begin/end: {line!r}")
            else:
                hierarchy.append((lineno, tokens))
        # :version, :documentation and unknown sections are ignored
    if bone is not None:
        raise MocapFileError(f"{path}:{bone_line}: bone block has no 'end'")

    try:
        length_unit = float(units.get("length", "1.0"))
    except ValueError:
        raise MocapFileError(f"{path}: ':units length' is not a number: {units['length']!r}") from None
    if not length_unit > 0:
        raise MocapFileError(f"{path}: ':units length' must be positive, got {length_unit}")
    angle_unit = units.get("angle", "deg").lower()
    if angle_unit not in ("deg", "rad"):
        raise MocapFileError(f"{path}: ':units angle' must be deg or rad, got {angle_unit!r}")
    to_rad = math.pi / 180.0 if angle_unit == "deg" else 1.0

    root_order = tuple(t.lower() for t in root.get("order", ["TX", "TY", "TZ", "RX", "RY", "RZ"]))
    bad = [t for t in root_order if t not in ("tx", "ty", "tz", "rx", "ry", "rz")]
    if bad or len(set(root_order)) != len(root_order):
        raise MocapFileError(f"{path}: ':root order' has invalid channels {root_order}")
    root_axis = "".join(root.get("axis", ["XYZ"])).upper()
    if sorted(root_axis) != ["X", "Y", "Z"]:
        raise MocapFileError(f"{path}: ':root axis' must be a permutation of XYZ, got {root_axis!r}")
    root_position = _floats(root.get("position", ["0", "0", "0"]), path, 0, "root position")
    root_orientation = _floats(root.get("orientation", ["0", "0", "0"]), path, 0, "root orientation") * to_rad
    if root_position.shape != (3,) or root_orientation.shape != (3,):
        raise MocapFileError(f"{path}: ':root position/orientation' need 3 numbers each")
    if np.any(root_position != 0):
        # the orientation is not ignored: it is the root's local frame C, as a bone's axis is (forward_kinematics)
        log.warning("%s: a non-zero :root position is ignored (the AMC root translation is absolute)", path)

    bones: dict[str, Bone] = {}
    for bline, fields, lims in raw_bones:
        for req in ("name", "direction", "length", "axis"):
            if req not in fields:
                raise MocapFileError(f"{path}:{bline}: bone block has no '{req}'")
        bname = fields["name"][0] if fields["name"] else ""
        if not bname or bname == "root" or bname in bones:
            raise MocapFileError(f"{path}:{bline}: invalid or duplicate bone name {bname!r}")
        direction = _floats(fields["direction"], path, bline, f"bone {bname} direction")
        if direction.shape != (3,):
            raise MocapFileError(f"{path}:{bline}: bone {bname}: direction needs 3 numbers")
        norm = float(np.linalg.norm(direction))
        if norm > 0:
            direction = direction / norm  # CMU directions are unit up to print precision (~1e-6)
        length = _floats(fields["length"][:1], path, bline, f"bone {bname} length")
        axis_tokens = fields["axis"]
        if len(axis_tokens) != 4 or sorted(axis_tokens[3].upper()) != ["X", "Y", "Z"]:
            raise MocapFileError(f"{path}:{bline}: bone {bname}: 'axis' needs 3 angles and an order like XYZ")
        axis = _floats(axis_tokens[:3], path, bline, f"bone {bname} axis") * to_rad
        dof = tuple(t.lower() for t in fields.get("dof", []))
        bad = [d for d in dof if d not in ("rx", "ry", "rz", "tx", "ty", "tz", "l")]
        if bad:
            raise MocapFileError(f"{path}:{bline}: bone {bname}: unknown dof {bad}")
        limits: list[tuple[float, float]] = []
        for lline, text in lims:
            for lo, hi in re.findall(rf"\(\s*({_NUM})\s+({_NUM})\s*\)", text):
                limits.append((float(lo), float(hi)))
            if not re.fullmatch(rf"\s*(\(\s*(?:{_NUM})\s+(?:{_NUM})\s*\)\s*)+", text):
                raise MocapFileError(f"{path}:{lline}: bone {bname}: cannot parse limits {text.strip()!r}")
        if lims and len(limits) != len(dof):
            raise MocapFileError(f"{path}:{bline}: bone {bname}: {len(limits)} limits for {len(dof)} dofs")
        bid = None
        if "id" in fields and fields["id"]:
            try:
                bid = int(fields["id"][0])
            except ValueError:
                raise MocapFileError(f"{path}:{bline}: bone {bname}: id is not an integer") from None
        bones[bname] = Bone(bname, direction, float(length[0]), axis, axis_tokens[3].upper(), dof, limits, bid)
    if not bones:
        raise MocapFileError(f"{path}: no ':bonedata' bones found")

    parent: dict[str, str] = {}
    for hline, tokens in hierarchy:
        p, kids = tokens[0], tokens[1:]
        if p != "root" and p not in bones:
            raise MocapFileError(f"{path}:{hline}: hierarchy names unknown bone {p!r}")
        for k in kids:
            if k not in bones:
                raise MocapFileError(f"{path}:{hline}: hierarchy names unknown bone {k!r}")
            if k in parent:
                raise MocapFileError(f"{path}:{hline}: bone {k!r} has two parents ({parent[k]!r} and {p!r})")
            parent[k] = p
    orphans = [b for b in bones if b not in parent]
    if orphans:
        raise MocapFileError(f"{path}: bones missing from ':hierarchy': {orphans}")
    sk = Skeleton(path, name, length_unit, angle_unit, root_order, root_axis, root_position, root_orientation,
                  bones, parent)  # fmt: skip
    if len(sk.topological_order()) != len(bones):
        raise MocapFileError(f"{path}: ':hierarchy' has a cycle or bones not connected to root")
    return sk


# ----------------------------------------------------------------------------------------------------------- AMC


def parse_amc(path: str | Path) -> list[dict[str, np.ndarray]]:
    """Parse an Acclaim motion file (``.amc``) into one ``{bone: values}`` dict per frame, **all** frames kept.

    Values are as written (ASF units for translations, ASF angle units — degrees for CMU — for rotations), in the
    bone's dof order (the root in the ASF ``:root order``). Frame-number lines must count up by one. Raises
    :class:`MocapFileError` naming the file and line on malformed input.
    """
    path = Path(path)
    lines = _read_lines(path)
    frames: list[dict[str, np.ndarray]] = []
    current: dict[str, np.ndarray] | None = None
    last_number: int | None = None
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#") or line.startswith(":"):
            continue
        tokens = line.split()
        if len(tokens) == 1 and tokens[0].lstrip("-").isdigit():
            number = int(tokens[0])
            if last_number is not None and number != last_number + 1:
                raise MocapFileError(f"{path}:{lineno}: frame {number} follows frame {last_number}")
            last_number = number
            current = {}
            frames.append(current)
            continue
        if current is None:
            raise MocapFileError(f"{path}:{lineno}: bone line before the first frame number: {line[:60]!r}")
        bname = tokens[0]
        if bname in current:
            raise MocapFileError(f"{path}:{lineno}: bone {bname!r} appears twice in frame {last_number}")
        try:
            current[bname] = np.array([float(t) for t in tokens[1:]], dtype=np.float64)
        except ValueError:
            raise MocapFileError(f"{path}:{lineno}: bone {bname!r}: expected numbers, got {line[:80]!r}") from None
    if not frames:
        raise MocapFileError(f"{path}: no frames found")
    return frames


# -------------------------------------------------------------------------------------------- forward kinematics


def _axis_rotation(axis: str, angle: np.ndarray) -> np.ndarray:
    """Rotation matrices about ``axis`` ("x", "y" or "z") by ``angle`` radians: shape ``angle.shape + (3, 3)``."""
    c, s = np.cos(angle), np.sin(angle)
    one, zero = np.ones_like(angle), np.zeros_like(angle)
    if axis == "x":
        rows = [[one, zero, zero], [zero, c, -s], [zero, s, c]]
    elif axis == "y":
        rows = [[c, zero, s], [zero, one, zero], [-s, zero, c]]
    elif axis == "z":
        rows = [[c, -s, zero], [s, c, zero], [zero, zero, one]]
    else:  # pragma: no cover - callers validate
        raise ValueError(f"unknown rotation axis {axis!r}")
    return np.stack([np.stack(r, axis=-1) for r in rows], axis=-2)


def _euler(angles: np.ndarray, order: str) -> np.ndarray:
    """Rotation applying ``angles[i]`` about ``order[i]`` in listed order: for "XYZ", ``Rz(a2)·Ry(a1)·Rx(a0)``."""
    R = np.eye(3)
    for a, ax in zip(angles, order.lower()):
        R = _axis_rotation(ax, np.asarray(a, dtype=np.float64)) @ R
    return R


def _frames_matrix(frames: Sequence[dict[str, np.ndarray]], bone: str, n: int, where: str) -> np.ndarray:
    """Stack ``frames[t][bone]`` into a ``(T, n)`` array; errors name the frame."""
    out = np.empty((len(frames), n), dtype=np.float64)
    for t, f in enumerate(frames):
        v = f.get(bone)
        if v is None:
            raise MocapFileError(f"{where}: frame index {t}: bone {bone!r} is missing")
        if v.shape != (n,):
            raise MocapFileError(f"{where}: frame index {t}: bone {bone!r} has {v.size} values, expected {n}")
        out[t] = v
    return out


def forward_kinematics(
    skeleton: Skeleton, frames: Sequence[dict[str, np.ndarray]]
) -> tuple[np.ndarray, list[str]]:
    """Global 3D end point of every bone for every frame, in inches (y up).

    Returns ``(positions, bone_names)`` with ``positions`` of shape ``(T, 1 + n_bones, 3)``; ``bone_names[0]`` is
    ``"root"`` (whose "end" is the root position, ``translation / length_unit``) followed by the ASF bones in
    ``:bonedata`` order. A bone's start is its parent's end. Vectorised over frames.

    Convention (checked against ``pyacclaim`` to 3e-14 in and a BVH conversion, see the mocap PROVENANCE.md):
    ``G = G_parent · C · M · C⁻¹``; ``C`` from the bone's ``axis`` (``Rz·Ry·Rx`` for XYZ; the root's from its ASF
    ``orientation`` in its ``axis`` order, as other Acclaim readers build it; 0 in every CMU file), ``M`` the dof rotations
    applied in listed order (``Rz·Ry·Rx`` for ``rx ry rz``); bone end = start + ``G · direction · length/unit``.
    Bones without dofs (e.g. CMU hip joints) are rigid (``M = I``); translation/length dofs are not supported.
    """
    if not frames:
        raise ValueError(f"{skeleton.path}: forward_kinematics needs at least one frame")
    where = f"motion for skeleton {skeleton.path}"
    known = set(skeleton.bones) | {"root"}
    extra = sorted(set().union(*(f.keys() for f in frames)) - known)
    if extra:
        raise MocapFileError(f"{where}: motion names bones absent from the skeleton: {extra}")
    to_rad = math.pi / 180.0 if skeleton.angle_unit == "deg" else 1.0
    T = len(frames)
    unit = skeleton.length_unit

    root_vals = _frames_matrix(frames, "root", len(skeleton.root_order), where)
    chan = {c: root_vals[:, i] for i, c in enumerate(skeleton.root_order)}
    root_pos = np.stack([chan.get(c, np.zeros(T)) for c in ("tx", "ty", "tz")], axis=-1) / unit
    M = np.broadcast_to(np.eye(3), (T, 3, 3))
    for c in skeleton.root_order:
        if c.startswith("r"):
            M = _axis_rotation(c[1], chan[c] * to_rad) @ M
    C = _euler(skeleton.root_orientation, skeleton.root_axis)
    G: dict[str, np.ndarray] = {"root": C @ M @ C.T}
    end: dict[str, np.ndarray] = {"root": root_pos}

    for name in skeleton.topological_order():
        bone = skeleton.bones[name]
        if any(d not in ("rx", "ry", "rz") for d in bone.dof):
            raise MocapFileError(f"{skeleton.path}: bone {name}: only rotational dofs are supported, got {bone.dof}")
        C = _euler(bone.axis, bone.axis_order)
        if bone.dof:
            vals = _frames_matrix(frames, name, len(bone.dof), where) * to_rad
            M = np.broadcast_to(np.eye(3), (T, 3, 3))
            for i, d in enumerate(bone.dof):
                M = _axis_rotation(d[1], vals[:, i]) @ M
            local = C @ M @ C.T
        else:
            local = np.broadcast_to(np.eye(3), (T, 3, 3))  # C · I · C⁻¹
        p = skeleton.parent[name]
        G[name] = G[p] @ local
        offset = bone.direction * (bone.length / unit)
        end[name] = end[p] + G[name] @ offset

    names = skeleton.bone_names
    return np.stack([end[n] for n in names], axis=1), names


def bone_starts(skeleton: Skeleton, positions: np.ndarray, bone_names: Sequence[str]) -> np.ndarray:
    """Start point of each bone: its parent's end (the root starts at its own position). Same shape as ``positions``."""
    index = {n: i for i, n in enumerate(bone_names)}
    parents = [index[skeleton.parent[n]] if n != "root" else index["root"] for n in bone_names]
    return positions[:, parents, :]


def load_trial(raw_dir: str | Path, trial: str) -> tuple[np.ndarray, list[str], Skeleton]:
    """Positions ``(T, 1 + n_bones, 3)`` in inches of ``raw_dir/cmu/<subject>/<trial>.amc`` with the subject's ASF."""
    raw_dir = Path(raw_dir)
    if not re.fullmatch(r"\d+_\d+", trial):
        raise ValueError(f"trial {trial!r}: expected '<subject>_<trial>', e.g. '07_01'")
    subject = trial.split("_")[0]
    asf = raw_dir / "cmu" / subject / f"{subject}.asf"
    amc = raw_dir / "cmu" / subject / f"{trial}.amc"
    for f in (asf, amc):
        if not f.is_file():
            raise MissingMocapFileError(f"{f}: file not found (needed for mocap trial {trial})")
    sk = parse_asf(asf)
    pos, names = forward_kinematics(sk, parse_amc(amc))
    return pos, names, sk


# ------------------------------------------------------------------------------------------------------ tracks
# ------------------------------------------------------------------------------------------------------ tracks


def _subject(trial: str) -> str:
    return trial.split("_")[0]


def check_split(trials: Sequence[str], test_trials: Sequence[str] | None, *, warn: bool = True) -> None:
    """Validate a mocap trial list and test-trial choice without reading any file; one-line ``ValueError``.

    Checks: at least 2 trials, each named ``'<subject>_<trial>'`` with digits (e.g. ``'07_01'``), no duplicates;
    when ``test_trials`` is given (``None`` means "chosen by seed", see :func:`prepare_mocap`): non-empty, no
    duplicates, all in ``trials``, at least one trial left for training. A test trial whose subject has no trial in
    training is allowed (a cross-subject test is a legitimate experiment) but logged as a warning (``warn``; params
    validation, which every stage runs, leaves it to the preprocess stage, so that it is said once).
    """
    trials = list(trials)
    if not trials:
        raise ValueError("mocap trials: no trials given")
    bad = [t for t in trials if not isinstance(t, str) or not re.fullmatch(r"\d+_\d+", t)]
    if bad:
        raise ValueError(f"mocap trials [{brief_list(bad)}]: expected '<subject>_<trial>' strings such as '07_01'")
    if len(set(trials)) != len(trials):
        raise ValueError(f"mocap trials: duplicate trials in [{brief_list(trials)}]")
    if len(trials) < 2:
        raise ValueError("mocap trials: at least 2 trials are needed to split train and test by trial")
    if test_trials is None:
        return
    test_trials = list(test_trials)
    if len(set(test_trials)) != len(test_trials):
        raise ValueError(f"mocap test_trials: duplicate trials in [{brief_list(test_trials)}]")
    unknown = [t for t in test_trials if t not in trials]
    if unknown:
        raise ValueError(f"mocap test_trials [{brief_list(unknown)}] are not in trials [{brief_list(trials)}]")
    if not test_trials or len(test_trials) == len(trials):
        raise ValueError("mocap test_trials must hold at least one trial and leave one for training")
    seen = {_subject(t) for t in trials if t not in test_trials}
    unseen = sorted({_subject(t) for t in test_trials} - seen)
    if unseen and warn:
        log.warning("mocap test_trials %s: subject(s) %s have no trial in training (a cross-subject test)",
                    test_trials, unseen)  # fmt: skip


def _choose_test_trials(trials: list[str], frames: dict[str, int], n_train: int, n_test: int,
                        track_length: int, seed: int) -> list[str]:
    """The seeded default test split: whole trials, every subject keeps a training trial where possible.

    Takes ``max(1, round(len(trials) * n_test / (n_train + n_test)))`` trials in a seeded random order among the
    trials whose subject has another trial; if their distinct windows (``frames - track_length + 1`` each) are
    fewer than ``n_test``, more trials of that order are added while each subject keeps a training trial.
    """
    rng = np.random.default_rng(seed)
    order = [trials[i] for i in rng.permutation(len(trials))]
    per_subject: dict[str, int] = {}
    for t in trials:
        per_subject[_subject(t)] = per_subject.get(_subject(t), 0) + 1
    target = min(max(1, round(len(trials) * n_test / (n_train + n_test))), len(trials) - 1)
    chosen: list[str] = []

    for t in order:
        windows = sum(max(0, frames[c] - track_length + 1) for c in chosen)
        if len(chosen) >= target and windows >= n_test:
            break
        if per_subject[_subject(t)] > 1:  # the subject keeps at least one training trial
            chosen.append(t)
            per_subject[_subject(t)] -= 1
    if not chosen:  # every subject has a single trial: a cross-subject test cannot be avoided
        chosen = order[:target]
        log.warning("mocap: every subject has one trial, so the test trials %s are subjects unseen in training",
                    chosen)  # fmt: skip
    return [t for t in trials if t in chosen]


def _allocate(lengths: Sequence[int], n: int, track_length: int) -> list[int]:
    """Share up to ``n`` tracks among trials proportionally to their lengths (D'Hondt / highest averages).

    Trials first receive tracks only up to their number of disjoint windows (``length // track_length``); only
    when all of those are used do further tracks go (still proportionally to length, so that every frame is, on
    average, in as many tracks as any other) to trials that then must overlap, each up to its number of
    *distinct* windows (``length - track_length + 1`` start frames). No trial ever gets two identical windows, so
    when all trials are full the total is less than ``n``. Deterministic (ties go to the earlier trial).
    """
    counts = [0] * len(lengths)
    for caps in ([L // track_length for L in lengths], [max(0, L - track_length + 1) for L in lengths]):
        while sum(counts) < n:
            open_ = [i for i in range(len(lengths)) if counts[i] < caps[i]]
            if not open_:
                break
            best = max(open_, key=lambda i: (lengths[i] / (counts[i] + 1), -i))
            counts[best] += 1
    return counts


def _window_starts(length: int, k: int, track_length: int) -> list[int]:
    """``k`` distinct, evenly spaced window starts in a trial of ``length`` frames (centred if ``k == 1``).

    Starts run from 0 to ``length - track_length``; consecutive starts differ by at least
    ``floor((length - track_length) / (k - 1)) >= 1``, so windows are disjoint whenever ``k * track_length <=
    length``. Raises ``ValueError`` when ``k`` exceeds the ``length - track_length + 1`` distinct windows.
    """
    span = length - track_length
    if k <= 0:
        return []
    if k > span + 1:
        raise ValueError(f"{k} windows of {track_length} frames in {length} frames: only {max(0, span + 1)} "
                         "distinct windows exist")  # fmt: skip
    if k == 1:
        return [span // 2]
    return [(i * span) // (k - 1) for i in range(k)]


def _split_summary(where: list[list], n_requested: int, track_length: int) -> dict:
    """Counts of one split's tracks: requested/made, distinct frames covered, overlap and the smallest shift."""
    starts: dict[str, list[int]] = {}
    for trial, s in where:
        starts.setdefault(trial, []).append(int(s))
    distinct, gaps = 0, []
    for ss in starts.values():
        ss = sorted(ss)
        gaps += [b - a for a, b in zip(ss, ss[1:])]
        covered = np.zeros(ss[-1] + track_length, dtype=bool)
        for s in ss:
            covered[s : s + track_length] = True
        distinct += int(covered.sum())
    return {
        "n_requested": int(n_requested),
        "n_tracks": len(where),
        "frames": len(where) * track_length,
        "distinct_frames": distinct,
        "overlap": bool(gaps) and min(gaps) < track_length,
        "min_start_gap": min(gaps) if gaps else None,
    }


def prepare_mocap(
    raw_dir: Path,
    *,
    trials: list[str] = list(DEFAULT_TRIALS),
    track_length: int = 300,
    n_train: int = 40,
    n_test: int = 8,
    test_trials: list[str] | None = None,
    bones: list[str] | None = None,
    seed: int = 0,
) -> SequenceDataset:
    """Build the Mocap data set: ``n_train``/``n_test`` tracks of ``track_length`` frames (120 Hz) of joint positions.

    Features are the 3D end points (inches, y up) of ``bones`` (default :data:`DEFAULT_BONES`, 17 bones → 51
    features named ``"<bone>_x"``, ``"<bone>_y"``, ``"<bone>_z"``), **relative to the root position of the same
    frame**, so that walking across the capture volume does not dominate the signal (heading is kept: features are
    in the global, not the body, frame). They are then standardised with the mean and standard deviation of all
    train-track frames (``meta["normalization"]``, inches).

    The split is **by trial first**, so no test frame appears in a train track. ``test_trials`` defaults to a
    seeded random choice of ``max(1, round(len(trials) * n_test / (n_train + n_test)))`` trials among those whose
    subject keeps a training trial (more are added if they hold fewer than ``n_test`` distinct windows); see
    :func:`check_split` for what an explicit list must satisfy. Tracks are then shared among each split's trials
    proportionally to trial length (:func:`_allocate`) and placed as evenly spaced windows within each trial.
    Windows overlap only when a split's trials hold fewer than ``n`` disjoint windows, and **no two tracks of a
    split are ever identical**: a trial of ``T`` frames has only ``T - track_length + 1`` distinct windows, and
    when a split's trials hold fewer distinct windows than requested, fewer tracks are made (with a warning)
    rather than duplicates.

    Metadata: ``meta["tracks"]`` lists ``[trial, start_frame]`` per track; ``meta["overlap"]`` says per split
    whether windows overlap; ``meta["splits"][split]`` holds ``n_requested``, ``n_tracks``, ``frames``
    (``n_tracks * track_length``), ``distinct_frames`` (frames covered by at least one track), ``overlap`` and
    ``min_start_gap`` (smallest shift in frames between two tracks of the same trial, ``None`` if no trial has two).

    ``raw_dir`` holds ``cmu/<subject>/<subject>.asf`` and ``cmu/<subject>/<trial>.amc``. Raises ``ValueError``
    for a trial shorter than ``track_length``, a missing file (named; the error is also a ``FileNotFoundError``),
    unknown bones or an impossible split.
    """
    raw_dir = Path(raw_dir)
    trials = list(trials)
    if track_length < 1 or n_train < 1 or n_test < 1:
        raise ValueError(f"prepare_mocap: need track_length, n_train, n_test >= 1 (got {track_length}, "
                         f"{n_train}, {n_test})")  # fmt: skip
    try:
        check_split(trials, test_trials)
    except ValueError as exc:
        raise ValueError(f"prepare_mocap: {exc}") from None

    bones = list(DEFAULT_BONES if bones is None else bones)
    if not bones or len(set(bones)) != len(bones):
        raise ValueError(f"prepare_mocap: bones must be a non-empty list without duplicates, got {bones}")

    data: dict[str, np.ndarray] = {}
    frames: dict[str, int] = {}
    for trial in trials:
        pos, names, sk = load_trial(raw_dir, trial)
        unknown = [b for b in bones if b not in names]
        if unknown:
            raise ValueError(f"bones={bones!r}: {unknown} are not in {sk.path} (its bones: {names})")
        T = pos.shape[0]
        frames[trial] = T
        if T < track_length:
            amc = raw_dir / "cmu" / _subject(trial) / f"{trial}.amc"
            raise ValueError(f"{amc}: trial {trial} has {T} frames, fewer than track_length={track_length}")
        idx = [names.index(b) for b in bones]
        rel = pos[:, idx, :] - pos[:, :1, :]  # relative to the root position of the same frame
        data[trial] = rel.reshape(T, -1)
        log.debug("mocap trial %s: %d frames", trial, T)

    if test_trials is None:
        test_trials = _choose_test_trials(trials, frames, n_train, n_test, track_length, seed)
    else:
        test_trials = list(test_trials)
    train_trials = [t for t in trials if t not in test_trials]

    def cut(split: str, split_trials: list[str], n: int) -> tuple[list[np.ndarray], list[list], dict]:
        counts = _allocate([frames[t] for t in split_trials], n, track_length)
        tracks, where = [], []
        for t, k in zip(split_trials, counts):
            for s in _window_starts(frames[t], k, track_length):
                tracks.append(data[t][s : s + track_length])
                where.append([t, int(s)])
        summary = _split_summary(where, n, track_length)
        if summary["n_tracks"] < n:
            log.warning("mocap %s: trials %s hold only %d distinct %d-frame windows; made %d tracks, not n_%s=%d "
                        "(no duplicates)", split, split_trials, summary["n_tracks"], track_length,
                        summary["n_tracks"], split, n)  # fmt: skip
        elif summary["overlap"]:
            log.warning("mocap %s: %d tracks of %d frames overlap: they cover %d distinct frames of trials %s; "
                        "smallest shift between two tracks: %d frame(s)", split, summary["n_tracks"], track_length,
                        summary["distinct_frames"], split_trials, summary["min_start_gap"])  # fmt: skip
        return tracks, where, summary

    train, train_where, train_summary = cut("train", train_trials, n_train)
    test, test_where, test_summary = cut("test", test_trials, n_test)

    stacked = np.concatenate(train, axis=0)
    mean = stacked.mean(axis=0)
    std = stacked.std(axis=0)
    std = np.where(std > 1e-12, std, 1.0)
    train = [(x - mean) / std for x in train]
    test = [(x - mean) / std for x in test]

    features = [f"{b}_{c}" for b in bones for c in "xyz"]
    meta = {
        "source": "CMU Graphics Lab Motion Capture Database (mocap.cs.cmu.edu), walking trials, ASF/AMC; "
        "joint end points by forward kinematics, inches relative to the root position, 120 Hz",
        "trials": trials,
        "train_trials": train_trials,
        "test_trials": test_trials,
        "frames_per_trial": frames,
        "track_length": track_length,
        "tracks": {"train": train_where, "test": test_where},
        "overlap": {"train": train_summary["overlap"], "test": test_summary["overlap"]},
        "splits": {"train": train_summary, "test": test_summary},
        "bones": bones,
        "units": "inches relative to root position, then standardised",
        "frame_rate_hz": FRAME_RATE_HZ,
        "seed": seed,
        "normalization": {"mean": mean.tolist(), "std": std.tolist()},
    }
    return SequenceDataset(kind="continuous", train=train, test=test, features=features, meta=meta)
