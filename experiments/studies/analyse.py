"""Recomputes every number of a study's RESULT.md from its committed metrics (experiments/studies/<name>/).

    .venv/bin/python -m experiments.studies.analyse filter_vs_none [--figure PATH]
    .venv/bin/python -m experiments.studies.analyse template_collapse
    .venv/bin/python -m experiments.studies.analyse gradient_buckets
    .venv/bin/python -m experiments.studies.analyse diagnostics_vs_success

Prints the study's result tables in markdown (RESULT.md quotes them verbatim) and writes its figure
(`<study>/figure.png` unless --figure). Each study's PROTOCOL.md defines the endpoints and the tests computed here;
the computations are in experiments/studies/analyses/<name>.py.
"""
from __future__ import annotations

import argparse
import os
import sys

from experiments.studies.analyses import diagnostics_vs_success, filter_vs_none, gradient_buckets, template_collapse

FOLDER = os.path.dirname(os.path.abspath(__file__))
STUDIES = {"filter_vs_none": filter_vs_none.analyse, "template_collapse": template_collapse.analyse,
           "gradient_buckets": gradient_buckets.analyse, "diagnostics_vs_success": diagnostics_vs_success.analyse}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study", choices=sorted(STUDIES))
    parser.add_argument("--figure", default=None, help="where to write the figure (default <study>/figure.png)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    study = os.path.join(FOLDER, args.study)
    print("\n".join(STUDIES[args.study](study, args.figure or os.path.join(study, "figure.png"))))


if __name__ == "__main__":
    main()
