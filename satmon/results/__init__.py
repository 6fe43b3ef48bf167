"""What satmon concludes, as frozen values: the verdict and its card, the probe's report, the stop record.

Every result is built in one place and changed only with :func:`dataclasses.replace`; the writers
in :mod:`satmon.io` and the CLI read them, nothing below them does.
"""
