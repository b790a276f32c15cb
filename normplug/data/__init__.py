"""Data for normplug: a seeded synthetic translation corpus and the prepare helpers
behind scripts/prepare-*.sh. Nothing here imports torch or fairseq."""
