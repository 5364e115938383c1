"""Unit tests of the decision core (webhook/core): digests, references, plans, records, waves."""
