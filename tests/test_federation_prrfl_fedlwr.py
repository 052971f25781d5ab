"""The second half of the equivalence matrix (tests/federation_matrix.py) on one real Flower
federation: PRR-FL's paper and official flows, the Fed-LWR paper's fairness baselines and the
plug-in ``new-method`` writes, 2 rounds each, each run folder equal to the engine's byte for
byte. On the same federation a fourth SuperNode joins as PRR-FL's test-only cohort (``OOD``, test
rows only) and PRR-FL's two flows run with it: their final.json's ood part too equals the engine's.
Skipped where the ``flower`` extra is not installed."""

import json

import pytest

pytest.importorskip("flwr")

from tests.federation_matrix import COHORT_RUNS, MATRIX, SECOND_HALF, assert_equals_the_engine, federated_runs  # noqa: E402


@pytest.fixture(scope="module")
def federated(tmp_path_factory):
    yield from federated_runs(tmp_path_factory.mktemp("matrix"), SECOND_HALF, tuple(COHORT_RUNS))


@pytest.mark.slow
@pytest.mark.federation
@pytest.mark.parametrize("name", SECOND_HALF)
def test_every_method_on_a_real_federation_equals_the_engine_byte_for_byte(federated, name):
    assert_equals_the_engine(federated, name, MATRIX[name][0])


@pytest.mark.slow
@pytest.mark.federation
@pytest.mark.parametrize("name", list(COHORT_RUNS))
def test_a_test_only_cohort_on_a_real_federation_equals_the_engine_byte_for_byte(federated, name):
    """PRR-FL (paper and official flows) with site OOD's SuperNode as the test-only cohort: the run
    folder, final.json's ood part (per model, mean, ensemble) included, equals the engine's."""
    flower = assert_equals_the_engine(federated, name, "prrfl")
    ood = json.loads((flower / "final.json").read_text())["ood"]["OOD"]
    assert list(ood["per_model"]) == ["A", "B", "C"]
    for metric, value in ood["mean"].items():
        assert value == pytest.approx(sum(scores[metric] for scores in ood["per_model"].values()) / 3), metric
    assert sorted(json.loads((flower / "federation.json").read_text())["data_digests"]) == ["A", "B", "C", "OOD"]
