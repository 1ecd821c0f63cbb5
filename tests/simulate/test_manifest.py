"""The manifest of documented NKI names agrees with what simulate.install() provides."""

import copy

from nki_kernels.simulate import manifest


def test_manifest_matches_the_simulator():
    summary = manifest.check()
    assert summary["stale"] == [], "regenerate with tools/nki_manifest.py: " + repr(summary["stale"][:5])
    assert summary["total"] >= 200
    assert summary["counts"]["implemented"] >= 180


def test_every_entry_names_its_source_and_status():
    for entry in manifest.load():
        assert entry["module"].startswith("nki")
        assert entry["source"].startswith("aws-neuron/aws-neuron-sdk@")
        assert entry["status"] in ("implemented", "partial", "not yet")


def test_check_catches_a_false_claim():
    entries = copy.deepcopy(manifest.load())
    missing = dict(entries[0], name="no_such_instruction", status="implemented")
    entries.append(missing)                             # claimed, but the module lacks it
    fn = next(e for e in entries if e["name"] == "dma_copy")
    fn["parameters"] = fn["parameters"][1:]            # documented order no longer matches
    stale = {(m, n) for m, n, *_ in manifest.check(entries)["stale"]}
    assert (missing["module"], missing["name"]) in stale and ("nki.isa", "dma_copy") in stale
