"""`exactspec batch`: files of prompts to files of completions, through one `Session` per worker, on this
machine (`runner`) or on Ray Data (`on_ray`); records and seeds (`records`); the output file (`output`)."""
