"""`--model ORG/REPO[@REVISION]` beside paths, `default` and `synthetic:`; the cache layout."""
import pytest

from engined.weights.hub import ids, store
from engined.weights.loader import ModelLoadError, plan_model


@pytest.mark.parametrize("spec, repo, revision", [
    ("moonshotai/Kimi-Linear-48B-A3B-Instruct", "moonshotai/Kimi-Linear-48B-A3B-Instruct", "main"),
    ("org/repo@v1.0", "org/repo", "v1.0"),
    ("org/repo@refs/pr/3", "org/repo", "refs/pr/3"),
    ("org/repo@" + "a" * 40, "org/repo", "a" * 40),
])
def test_model_ids_parse(spec, repo, revision):
    assert ids.parse(spec) == ids.HubId(repo, revision)


@pytest.mark.parametrize("spec", ["default", "synthetic:tiny", "model.gguf", "dir/model.gguf",
                                  "./org/repo", "~/org/repo", "/abs/path", "a/b/c", "../x",
                                  "org/repo@"])
def test_other_specs_are_not_ids(spec):
    assert ids.parse(spec) is None


def test_an_existing_directory_stays_a_path(tmp_path, monkeypatch):
    (tmp_path / "org" / "repo").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert ids.parse("org/repo") is None


def test_an_id_not_in_the_cache_names_the_pull_command(kimi_cache):
    with pytest.raises(ModelLoadError, match=r"org/repo@v2 is not in the cache .*; run: "
                                             r"kimi-engine pull org/repo@v2"):
        plan_model("org/repo@v2")
    assert store.find(ids.HubId("org/repo")) is None and store.entries() == []
