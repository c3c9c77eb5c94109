"""Hosting: what an instance keeps for its visitors and hands to them.

The gallery of saved analyses (`store`: SQLite or PostgreSQL, owners, rate limits) and the exports
(`export`: JSON, CSV and the offline HTML report).

Who may import it: the pages (`components/`), scripts, benchmarks and tests. No panel imports it: a
panel computes a result; keeping and sending it is the host's business.
"""
