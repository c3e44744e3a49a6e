"""What the default algorithm runs is one table: docs/guide.md quotes `default_table()` (trainer.algorithms.choice) as
it is, and every row names what `choose_algorithm` runs in its case.

No Spark: `choose_algorithm` is pure. ``python tests/test_default_table.py --write`` writes the table between its
markers in docs/guide.md. Also here: the warning of an option only the parameter server serves (``compression``,
``overlap``, ``ps_shards`` above 1) where it turns the default from local SGD into DOWNPOUR.
"""

from __future__ import annotations

import itertools
import sys
import warnings
from pathlib import Path

import pytest

from marked_tables import with_table
from trainer.algorithms.choice import DEFAULT_CASES, FitFacts, choose_algorithm, default_table

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guide.md"
BEGIN, END = "<!-- default-table:begin -->", "<!-- default-table:end -->"

#: What each case runs, written out here so that a change of `choose_algorithm` fails until the pages follow.
EXPECTED = {
    "one worker": "downpour",
    "an option only the parameter server serves": "downpour",
    "an elastic fit": "downpour",
    "several workers on GPUs": "localsgd",
    "several CPU workers on more than one host": "localsgd",
    "several CPU workers on one host": "downpour",
    "several CPU workers, hosts not known": "downpour",
}


def case_of(facts: FitFacts) -> str:
    """The table's case for `facts`, from its "what counts" column, independently of `choose_algorithm`."""
    if facts.workers == 1:
        return "one worker"
    if facts.ps_options:
        return "an option only the parameter server serves"
    if facts.elastic:
        return "an elastic fit"
    if facts.gpus_per_worker >= 1:
        return "several workers on GPUs"
    if facts.hosts is None:
        return "several CPU workers, hosts not known"
    return "several CPU workers on more than one host" if facts.hosts > 1 else "several CPU workers on one host"


def test_the_guide_quotes_the_table_the_code_makes():
    page = GUIDE.read_text(encoding="utf-8")
    assert BEGIN in page and END in page, f"docs/guide.md lost its markers {BEGIN} {END}"
    assert page == with_table(page, (BEGIN, END), default_table()), (
        "docs/guide.md's table of the default algorithm differs from trainer.algorithms.choice.default_table(): run "
        "`python tests/test_default_table.py --write`, then make the words around it (and README.md's summary) "
        "say the same")


def test_every_row_names_what_choose_algorithm_runs():
    rows = default_table().splitlines()[2:]
    assert [case for case, _, _ in DEFAULT_CASES] == list(EXPECTED), "one row per case, in the order they are checked"
    assert len(rows) == len(DEFAULT_CASES)
    for row, (case, _, facts) in zip(rows, DEFAULT_CASES):
        cells = [cell.strip() for cell in row.strip("|").split(" | ")]
        choice = choose_algorithm(facts)
        assert case_of(facts) == case, f"the example of {case!r} is not of its case: {facts}"
        assert choice.algorithm.name == EXPECTED[case], f"{case}: choose_algorithm runs {choice.algorithm.name}"
        assert cells[0] == case and cells[3].startswith(f'`"{EXPECTED[case]}"`') and cells[4] == choice.reason


@pytest.mark.parametrize("workers, gpus, hosts, options, elastic", itertools.product(
    (1, 2, 3, 8), (0, 1, 2), (None, 1, 2, 5), ((), ("compression",), ("overlap", "ps_shards")), (False, True)))
def test_every_fit_runs_what_its_case_in_the_table_says(workers, gpus, hosts, options, elastic):
    facts = FitFacts(workers, gpus, hosts, options, elastic)
    assert choose_algorithm(facts).algorithm.name == EXPECTED[case_of(facts)]


@pytest.mark.parametrize("facts, instead", [
    (FitFacts(workers=3, hosts=4, ps_options=("compression",)), "3 workers on 4 hosts"),
    (FitFacts(workers=2, gpus_per_worker=1, hosts=None, ps_options=("overlap", "ps_shards")), "2 workers on GPUs"),
])
def test_an_option_only_the_server_serves_warns_where_it_replaces_local_sgd(facts, instead):
    with pytest.warns(UserWarning) as caught:
        choice = choose_algorithm(facts, warn=True)
    assert choice.algorithm.name == "downpour" and len(caught) == 1
    message = str(caught[0].message)
    given = " and ".join(facts.ps_options)
    assert message.startswith(f'{given} made algorithm="auto" run DOWNPOUR where {instead} would run local SGD')
    assert f"drop {given}" in message and 'algorithm="downpour"' in message


@pytest.mark.parametrize("facts, warn", [
    (FitFacts(workers=3, hosts=1, ps_options=("compression",)), True),     # DOWNPOUR on one host anyway
    (FitFacts(workers=3, hosts=None, ps_options=("compression",)), True),  # and where the hosts are not known
    (FitFacts(workers=1, hosts=4, ps_options=("compression",)), True),     # one worker: DOWNPOUR anyway
    (FitFacts(workers=3, hosts=4), True),                                  # nothing given: local SGD
    (FitFacts(workers=3, hosts=4, ps_options=("compression",)), False),    # the Trainer's own call, hosts unknown
])
def test_no_warning_where_the_option_changes_nothing_or_nobody_asked(facts, warn):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        choose_algorithm(facts, warn=warn)


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_default_table.py --write   (writes docs/guide.md's table of the default)")
    GUIDE.write_text(with_table(GUIDE.read_text(encoding="utf-8"), (BEGIN, END), default_table()), encoding="utf-8")
    print(f"wrote the table of the default algorithm into {GUIDE.relative_to(ROOT)}")


def test_hosts_count_machines_and_a_loopback_address_is_the_driver_s():
    from trainer.spark.session import count_hosts

    # a driver started by spark_session(url) on the embedded cluster's machine: its own address, workers on loopback
    assert count_hosts("10.0.0.5", ["10.0.0.5", "127.0.0.1", "127.0.0.1"]) == 1
    assert count_hosts("127.0.0.1", ["127.0.0.1", "10.0.0.7"]) == 1  # only local executors can reach such a driver
    assert count_hosts("localhost", ["localhost"]) == 1
    assert count_hosts("10.0.0.5", ["10.0.0.5", "10.0.0.6", "10.0.0.7"]) == 3  # the lab: a host per container
    assert count_hosts("jupyter", ["jupyter", "172.18.0.4", "::1"]) == 2
    assert count_hosts("10.0.0.5", []) == 1  # no executor yet: the driver's host
