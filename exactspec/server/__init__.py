"""The OpenAI-compatible server (`exactspec serve`): routes, request schemas, scheduler glue."""
