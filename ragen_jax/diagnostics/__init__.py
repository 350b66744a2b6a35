"""Collapse diagnostics (MI proxies of reasoning collapse, spec D) and gradient-component analysis (spec E.3)."""
