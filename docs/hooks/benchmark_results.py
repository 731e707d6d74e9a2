"""mkdocs hook: publish the committed benchmark results and draw their plots into a page.

mkdocs serves only what lies under docs/, and the results belong to benchmarks/results/
(the benchmarks write them there). Rather than keep a second copy, this hook adds every
PNG, CSV and TXT of benchmarks/results/ to the site under ``results/``, and replaces a line
``<!-- plots PREFIX -->`` in a page with every plot whose file name starts with PREFIX, so a
new plot of a family appears without editing the page. A marker that matches no plot is a
warning, which ``mkdocs build --strict`` turns into a failure.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
SITE_FOLDER = "results"
PUBLISHED = (".png", ".csv", ".txt")
MARKER = re.compile(r"^<!-- plots (\S+) -->$", re.MULTILINE)

log = logging.getLogger("mkdocs.hooks.benchmark_results")


def on_files(files, config):
    for path in sorted(RESULTS.iterdir()):
        if path.suffix in PUBLISHED:
            files.append(File.generated(config, f"{SITE_FOLDER}/{path.name}", abs_src_path=str(path)))
    return files


def on_page_markdown(markdown, page, config, files):
    here = posixpath.dirname(page.file.src_uri)

    def plots(match):
        prefix = match.group(1)
        names = sorted(p.name for p in RESULTS.glob(f"{prefix}*.png"))
        if not names:
            log.warning(f"{page.file.src_uri}: no plot in benchmarks/results/ starts with {prefix!r}")
        links = (posixpath.relpath(f"{SITE_FOLDER}/{name}", here or ".") for name in names)
        return "\n\n".join(f"![{name}]({link})" for name, link in zip(names, links))

    return MARKER.sub(plots, markdown)
