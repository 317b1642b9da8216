"""A user's kustomize overlay of deploy/, written to a folder and rendered: a namespace, a model name, the
kustomizations it builds on and the components it adds (e.g. keda-tls, network-policy)."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from helpers import ROOT, render


def render_overlay(folder: Path, *, namespace: str, model: str, resources: tuple[str, ...] = ("base",),
                   components: tuple[str, ...] = ("model-name",)) -> list[dict]:
    folder.mkdir(parents=True, exist_ok=True)
    deploy = os.path.relpath(ROOT / "deploy", folder)  # kustomize takes relative paths only
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "namespace": namespace,
        "resources": [f"{deploy}/{r}" for r in resources],
        "components": [f"{deploy}/components/{c}" for c in components],
        "configMapGenerator": [{"name": "model", "behavior": "replace", "literals": [f"name={model}"]}],
        "generatorOptions": {"disableNameSuffixHash": True},
    }
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return render(folder)


def find(docs: list[dict], kind: str, name: str | None = None) -> dict:
    [doc] = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    return doc
