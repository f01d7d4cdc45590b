"""Generators of the documentation site's reference pages (``docs/reference/``).

Each module renders one page from the code it documents, so the page cannot drift from it:
:mod:`hack.docgen.settings` from the pydantic settings (``flexlease/config.py``),
:mod:`hack.docgen.crds` from the CRD schemas (``manifests/base/crds/``) with the field
descriptions of the pydantic models they are generated from, :mod:`hack.docgen.labels`
from ``flexlease/api/keys.py`` and :mod:`hack.docgen.metrics` from the metric definitions in
the source. Rendering is pure (text in, text out); ``hack/gen_docs.py`` writes the pages and
the tests re-render them and compare (``tests/hack/docgen/``).
"""
