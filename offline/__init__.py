"""The offline builder: BN compilation and verification, monitor training, artifact building.

Needs the ``offline`` extra (pgmpy, python-sat, scikit-learn, torch, matplotlib).
"""
