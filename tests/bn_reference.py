"""The BN paper's reference classifiers over the public networks in ``shared/data/bn``.

One table for the tests and benches that reproduce the paper's figures: class variable,
positive state, threshold, variable order and, where published, the reference compiler's
quasi-reduced node count, positive inputs and seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from boxwatch.offline.bn.classifier import ClassifierSpec
from boxwatch.offline.bn.formats import load_network
from boxwatch.offline.bn.network import Network


@dataclass(frozen=True)
class ReferenceClassifier:
    """``P(class = positive | x) >= threshold`` over one shared network.

    ``positive`` None means the class's state index 1 (the paper's convention); ``order``
    None means the default features and order; ``reference`` is the published compiler's
    (quasi-reduced nodes, positive inputs, seconds), when known.
    """

    file: str
    class_variable: str
    positive: str | None
    threshold: float
    order: tuple[str, ...] | None = None
    reference: tuple[int, int, float] | None = None

    def spec(self, network: Network) -> ClassifierSpec:
        positive = self.positive or network.states[self.class_variable][1]
        return ClassifierSpec(self.class_variable, positive, self.threshold, order=self.order)

    def load(self, folder: Path) -> tuple[Network, ClassifierSpec]:
        """The network read from ``folder`` and this classifier's spec on it."""
        network = load_network(folder / self.file)
        return network, self.spec(network)


REFERENCE_CLASSIFIERS: dict[str, ReferenceClassifier] = {
    "asia": ReferenceClassifier("asia.bif.gz", "bronc", "yes", 0.5),
    "child": ReferenceClassifier(
        "child.bif.gz",
        "BirthAsphyxia",
        None,
        0.9,
        ("LVHreport", "GruntingReport", "RUQO2", "LowerBodyO2", "XrayReport", "Age", "CO2Report"),
        (41, 844, 3.2),
    ),
    "alarm": ReferenceClassifier(
        "alarm.bif.gz",
        "DISCONNECT",
        None,
        0.9,
        (
            "BP",
            "PCWP",
            "CVP",
            "PRESS",
            "MINVOL",
            "EXPCO2",
            "HISTORY",
            "PAP",
            "HRBP",
            "HRSAT",
            "HREKG",
        ),
        (180, 153_472, 19.7),
    ),
    "win95pts": ReferenceClassifier(
        "win95pts.bif.gz",
        "PTROFFLINE",
        None,
        0.5,
        (
            "Problem3",
            "PrtStatMem",
            "Problem2",
            "PrtStatPaper",
            "PrtStatToner",
            "Problem6",
            "PrtFile",
            "Problem1",
            "PrtIcon",
            "REPEAT",
            "PSERRMEM",
            "TstpsTxt",
            "HrglssDrtnAftrPrnt",
            "Problem5",
            "Problem4",
            "PrtStatOff",
        ),
        (242, 16_466, 143.0),
    ),
    "insurance": ReferenceClassifier("insurance.bif.gz", "RiskAversion", "Adventurous", 0.5),
    "credit": ReferenceClassifier("credit.net", "CreditWorthiness", "Positive", 0.5),
}
