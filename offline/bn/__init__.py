"""Bayesian-network classifiers: read, compile into exact decision diagrams, verify with SAT.

::

    from boxwatch.offline.bn import ClassifierSpec, compile_classifier, load_network

    net = load_network("credit.net")
    result = compile_classifier(net, ClassifierSpec("CreditWorthiness", "Positive", 0.5))
    # multi-class: the most probable state of the class, one sink per state
    child = compile_classifier(load_network("child.bif.gz"),
                               ClassifierSpec("Disease", decision="argmax"))

Modules: :mod:`.network` (the one form every reader makes), :mod:`.formats` (the readers, one
module per file format), :mod:`.classifier` (what is decided),
:mod:`.elimination`, :mod:`.separator`, :mod:`.plan` and :mod:`.limits` (sizing a compilation
before running it), :mod:`.compile` (the routes), :mod:`.exact` (float error bounds and exact
rational decisions near the threshold), :mod:`.rules` (the rule language),
:mod:`.cnf` (diagram to CNF) and :mod:`.verify` (rules and monotonicity).
"""

from typing import TYPE_CHECKING

from boxwatch.agent.lazy import lazy_exports

# The public names, by the module that defines them, each imported when first read: the
# rule language and the readers do not load the compiler's or the SAT solver's modules.
_EXPORTS = {
    "classifier": ("ClassifierSpec", "resolve_spec"),
    "compile": ("METHODS", "CompileResult", "compile_classifier"),
    "formats": ("load_network",),
    "network": ("Network",),
    "plan": ("CompileLimitError",),
    "rules": ("ClassifierSchema", "Spec", "load_spec"),
    "verify": ("BNVerifier", "VerificationReport"),
}

if TYPE_CHECKING:
    from boxwatch.offline.bn.classifier import ClassifierSpec, resolve_spec
    from boxwatch.offline.bn.compile import METHODS, CompileResult, compile_classifier
    from boxwatch.offline.bn.formats import load_network
    from boxwatch.offline.bn.network import Network
    from boxwatch.offline.bn.plan import CompileLimitError
    from boxwatch.offline.bn.rules import ClassifierSchema, Spec, load_spec
    from boxwatch.offline.bn.verify import BNVerifier, VerificationReport
else:
    __getattr__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "METHODS",
    "BNVerifier",
    "ClassifierSchema",
    "ClassifierSpec",
    "CompileLimitError",
    "CompileResult",
    "Network",
    "Spec",
    "VerificationReport",
    "compile_classifier",
    "load_network",
    "load_spec",
    "resolve_spec",
]
