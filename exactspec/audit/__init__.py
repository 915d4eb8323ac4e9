"""The exactness audit: do real speculative decoders (ours and transformers') sample the target's law?

Modules:

* `generators`: the `Generator` interface and the generators under test
  (exactspec's engine, transformers assisted generation through
  `exactspec.peers.hf`, and the two plain controls);
* `broken`: the deliberately broken `BrokenArgmaxDrafter` the audit must catch;
* `runner`: one audit (sample N sequences, exact target probabilities, G-test);
* `grid`: many audits with shared references (the tiny-model grid);
* `report`: terminal lines, JSON and Markdown reports;
* `tiny`: tiny random Hugging Face model pairs.

The command line is `exactspec.cli.audit`. Nothing is imported here, so `exactspec --help` stays fast.
"""
