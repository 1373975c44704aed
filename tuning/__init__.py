"""Turns what nodecheck.checks reads into recommended settings for training jobs."""
