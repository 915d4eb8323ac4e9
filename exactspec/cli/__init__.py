"""The `exactspec` command line.

One module per command (verify, generate, bench, audit), the flags they share in
`common`, the entry point in `main`.
"""
