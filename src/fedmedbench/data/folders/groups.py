"""Which images belong together (a patient, a case): the groups a split keeps whole, and how a CSV
of the user's (``split_csv``, ``groups_csv``) names an image.

An image is named, in order of preference, by its path under its site folder (``images/01_1.png``),
its path from the data root (``siteA/images/01_1.png``), or its file name or stem (``01_1.png``,
``01_1``) when no other image of the site has that name or stem. Paths are compared with ``/``
separators, and a leading ``./`` is ignored.

Groups come from ``group_pattern`` (``re.search`` on the image's path under its site folder, the
first capture group is the group), from ``groups_csv`` (columns site, image, group; every image
listed once), or by default: each 2-D image its own group, each NIfTI volume one group,
classification images the ``group`` column of ``labels.csv``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

from ...errors import closest
from .options import GROUPS_CSV_COLUMNS, FoldersDataError, FoldersOptions
from .reading import _line, _stem_and_format, read_option_csv


def normalise_image(value: str) -> str:
    """A CSV's image value as a path with ``/`` separators, without a leading ``./``."""
    value = str(value).strip().replace("\\", "/")
    while value.startswith("./"):
        value = value[2:]
    return value


def under_site(site: str, source: str) -> str:
    """The path of an image under its site folder; an image kept outside its site's folder (a
    classification ``labels.csv`` may point anywhere under the root) keeps its path from the root."""
    return source[len(site) + 1 :] if source.startswith(f"{site}/") else source


def _stem(name: str) -> str:
    parsed = _stem_and_format(Path(name))
    return parsed[0] if parsed else Path(name).stem


class ImageNames:
    """The images of one site (their paths from the data root, as the store's ``source`` column
    holds them) and the ways a CSV row may name one of them."""

    def __init__(self, site: str, sources: Sequence[str]):
        self.site = site
        self.sources = list(dict.fromkeys(sources))
        self._paths = {s: s for s in self.sources}
        self._under = {under_site(site, s): s for s in self.sources if s.startswith(f"{site}/")}
        self._names: dict[str, list[str]] = {}
        self._stems: dict[str, list[str]] = {}
        for source in self.sources:
            name = source.rsplit("/", 1)[-1]
            self._names.setdefault(name, []).append(source)
            self._stems.setdefault(_stem(name), []).append(source)

    def example(self) -> str:
        return under_site(self.site, self.sources[0]) if self.sources else "images/<file name>"

    def resolve(self, value: str, where: str) -> str | None:
        """The source an image value names, None when it names none; a file name or stem that
        several images of the site share is refused (one line naming two of them)."""
        value = normalise_image(value)
        found = self._paths.get(value) or self._under.get(value)
        if found is not None:
            return found
        for what, table in (("file name", self._names), ("stem", self._stems)):
            candidates = table.get(value)
            if candidates and len(candidates) > 1:
                a, b = (under_site(self.site, s) for s in candidates[:2])
                raise FoldersDataError(
                    f"{where}: image {value} is ambiguous: {len(candidates)} images of site {self.site} have "
                    f"this {what} ({a} and {b}); write the path under the site folder, e.g. {a}"
                )
            if candidates:
                return candidates[0]
        return None

    def unknown(self, where: str, value: str, more: int = 0) -> FoldersDataError:
        """The error for an image value that names no image of the site, with an accepted example
        from this site."""
        others = f" (and {more} more row(s))" if more else ""
        example = self.example()
        from_root = example if not self.sources or self.sources[0] == example else self.sources[0]
        return FoldersDataError(
            f"{where}: image {normalise_image(value)} is not an image of site {self.site} in the data{others}; "
            f"the image column takes the path under the site folder, e.g. {example} (also accepted: the path from the "
            f"data root, {from_root}, or the file name or stem where no other image of the site has it)"
        )


def pattern_group(pattern: re.Pattern, site: str, source: str, root: Path) -> str:
    """The group ``group_pattern`` finds in one image's path under its site folder."""
    subject = under_site(site, source)
    match = pattern.search(subject)
    if match is None or not match.group(1):
        what = "finds no group in" if match is None else "captures an empty group in"
        raise FoldersDataError(
            f"{root / source}: group_pattern '{pattern.pattern}' {what} '{subject}' (the image's path under its site "
            "folder; the pattern is searched anywhere in it and its first (...) is the group); fix the pattern or the file name"
        )
    return match.group(1)


def read_groups_csv(path: Path, names: Mapping[str, ImageNames]) -> dict[str, dict[str, str]]:
    """``{site: {source: group}}`` from the user's groups CSV, checked row by row: columns, sites,
    images (as ``ImageNames`` resolves them), empty groups, duplicates, and every image listed."""
    table = read_option_csv(path, "groups_csv", GROUPS_CSV_COLUMNS, " (one row per image)")
    out: dict[str, dict[str, str]] = {site: {} for site in names}
    lines: dict[tuple[str, str], int] = {}
    for i, row in enumerate(table.itertuples(index=False)):
        site, image, group = str(row.site).strip(), str(row.image), str(row.group).strip()
        where = f"{path} line {_line(i)}"
        if site not in names:
            raise FoldersDataError(
                f"{where}: site {site!r} is not in the data{closest(site, names)} (sites: {sorted(names)})"
            )
        source = names[site].resolve(image, where)
        if source is None:
            raise names[site].unknown(where, image)
        if not group:
            raise FoldersDataError(f"{where}: empty group for image {normalise_image(image)} of site {site}")
        if (site, source) in lines:
            raise FoldersDataError(
                f"{where}: image {normalise_image(image)} of site {site} is listed twice "
                f"(lines {lines[site, source]} and {_line(i)})"
            )
        lines[site, source] = _line(i)
        out[site][source] = group
    for site, known in names.items():
        left = [s for s in known.sources if s not in out[site]]
        if left:
            raise FoldersDataError(
                f"{path}: {len(left)} image(s) of site {site} have no group, e.g. "
                f"{under_site(site, left[0])}; every image needs a row (site, image, group)"
            )
    return out


def assign_groups(
    root: Path, options: FoldersOptions, sources: Mapping[str, Sequence[str]]
) -> dict[str, dict[str, str]] | None:
    """``{site: {source: group}}`` from ``group_pattern`` or ``groups_csv`` (groups without the site:
    the caller prefixes it), None when neither is set (the default groups apply)."""
    if options.group_pattern is not None:
        pattern = re.compile(options.group_pattern)
        return {
            site: {s: pattern_group(pattern, site, s, root) for s in dict.fromkeys(paths)}
            for site, paths in sources.items()
        }
    if options.groups_csv is not None:
        return read_groups_csv(
            Path(options.groups_csv), {site: ImageNames(site, paths) for site, paths in sources.items()}
        )
    return None


def groups_source(options: FoldersOptions) -> str:
    """Where the groups came from, for the report and the log."""
    if options.group_pattern is not None:
        return f"group_pattern '{options.group_pattern}'"  # as the user wrote it in YAML, backslashes single
    if options.groups_csv is not None:
        return f"groups_csv {Path(options.groups_csv).name}"
    return "labels.csv group column" if options.kind == "classification" else "default"


# A file name's prefix is what comes before its last separator: "01_1" -> "01", "patient_07_slice_3"
# -> "patient_07_slice". "." is no separator here (it also starts the suffix).
_PREFIX = re.compile(r"^(.+)([_\- ])[^_\- ]*$")


def shared_prefixes(stems: Sequence[str]) -> tuple[int, str, str, str, str] | None:
    """(number of prefixes, separator, prefix, two stems sharing it) when the stems look like several
    images per patient: at least two prefixes each shared by several stems, covering half the stems
    or more. One prefix shared by all (``ISIC_0000001``, ``img_001``) is a naming scheme, not patients."""
    found = [(m.group(1), m.group(2), stem) for stem in stems if (m := _PREFIX.match(stem))]
    counts = Counter(prefix for prefix, _, _ in found)
    shared = {p for p, n in counts.items() if n > 1}
    covered = sum(counts[p] for p in shared)
    if len(shared) < 2 or 2 * covered < len(stems):
        return None
    prefix, separator, first = next((p, s, stem) for p, s, stem in found if p in shared)
    second = next(stem for p, _, stem in found if p == prefix and stem != first)
    return len(counts), separator, prefix, first, second


def prefix_warning(sites: Mapping[str, Sequence[str]]) -> str | None:
    """One warning line for the sites whose every image is its own group while their file names
    (``sites``: site -> file names) share prefixes: a patient's images would be cut across splits."""
    hits = {site: found for site, names in sites.items() if (found := shared_prefixes([_stem(n) for n in names]))}
    if not hits:
        return None
    site, (n_prefixes, separator, prefix, first, second) = next(iter(hits.items()))
    names = ", ".join(hits)
    label = "site" if len(hits) == 1 else "sites"
    pattern = f"([^/]+){separator}[^{separator}/]*$"  # the file name up to its last separator
    return (
        f"{label} {names}: every image is its own group, but the file names share prefixes ({site}: "
        f"{len(sites[site])} images, {n_prefixes} prefixes before the last {separator!r}, e.g. {first} and {second} "
        f"share {prefix!r}); if a prefix names a patient, set group_pattern: '{pattern}' so that each patient's "
        "images stay in one split"
    )


def repeated_stem_warning(sites: Mapping[str, Sequence[str]]) -> str | None:
    """One warning line for the sites whose every image is its own group while one file stem names
    several images (``sites``: site -> paths; ``day1/ISIC_1.jpg`` and ``day2/ISIC_1.jpg``: one lesion
    photographed twice, most often)."""
    for site, paths in sites.items():
        by_stem: dict[str, list[str]] = {}
        for path in paths:
            by_stem.setdefault(_stem(path.rsplit("/", 1)[-1]), []).append(path)
        repeated = {stem: found for stem, found in by_stem.items() if len(found) > 1}
        if repeated:
            stem, found = next(iter(repeated.items()))
            return (
                f"site {site}: every image is its own group, but {len(repeated)} file stem(s) name several images (e.g. "
                f"{stem}: {under_site(site, found[0])} and {under_site(site, found[1])}); if a stem names a patient or "
                r"lesion, set group_pattern: '([^/.]+)\.[^/]*$' (the file name before its suffix) so that its images "
                "stay in one split"
            )
    return None


# A labels.csv column with one of these words in its name most likely names who or what was imaged.
SUBJECT_WORDS = ("patient", "subject", "lesion", "case", "person", "participant", "individual", "donor")


def subject_column_warning(table, known: Sequence[str]) -> str | None:
    """One warning line when ``labels.csv`` (``table``: its rows) has no group but a column named like
    a subject identifier whose values repeat: the images of one patient would be cut across splits."""
    for column in table.columns:
        if column in known or not any(word in str(column).lower() for word in SUBJECT_WORDS):
            continue
        values = table[column].astype(str).str.strip()
        counts = values[values != ""].value_counts()
        shared = counts[counts > 1]
        if len(shared):
            return (
                f"every image is its own group, but labels.csv column {column!r} looks like a subject identifier and "
                f"{len(shared)} of its values are on several images (e.g. {shared.index[0]} on {int(shared.iloc[0])} "
                f"images); if it names the patient (or lesion), rename the column to group (or set groups_csv) so "
                f"that each one's images stay in one split"
            )
    return None


def shared_group_warning(groups: Mapping[str, Mapping[str, str]], source: str) -> str | None:
    """One warning line naming the groups (patients) that ``groups`` (site -> source -> group) puts
    in more than one site, and those sites: a federated split assumes sites do not share patients."""
    sites_of: dict[str, list[str]] = {}
    for site, of_site in groups.items():
        for group in dict.fromkeys(of_site.values()):
            sites_of.setdefault(group, []).append(site)
    shared = {g: s for g, s in sites_of.items() if len(s) > 1}
    if not shared:
        return None
    shown = "; ".join(f"{g} in sites {', '.join(s)}" for g, s in list(shared.items())[:5]) + (
        "; ..." if len(shared) > 5 else ""
    )
    return (
        f"{source}: {len(shared)} patient(s) (groups) are in more than one site: {shown}; federated learning assumes "
        "sites do not share patients (a patient's images in two clients are seen in training by one and tested by "
        "the other): keep each patient's images in one site, or give distinct patients distinct group names"
    )
