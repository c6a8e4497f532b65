"""`ajet serve`: train on episodes that agents run elsewhere, through the episode API
(docs/episode_api.md). One module a part:

- `protocol`: the wire models and the errors (with their HTTP status and code);
- `http`: the routes on the gateway (begin, finish, abort, status);
- `broker`: `EpisodeBroker`, which hands out the reader's tasks in groups, scores and collects
  the episodes, and gives the trainer `batch_size` complete groups a step;
- `source`: `ServedEpisodes`, the RL recipe's episode source: the broker behind a public gateway;
- `client`: `EpisodeClient`, the Python client (httpx only, nothing else of ajet).

Nothing is imported here, so that `from ajet.serve.client import EpisodeClient` stays light.
"""
