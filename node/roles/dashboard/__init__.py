"""`pulse dashboard`: a live web page for a run, built from what any node can read in the DHT.

Files (in import order):

- `board.py`   `RunBoard`, what the page shows, derived from verified records (`Seen`); pure
- `svg.py`     inline SVG charts: points per round, grouped bars on a log scale; pure
- `render.py`  the page: server-rendered HTML around the board and its charts; pure
- `watch.py`   `Watcher`: reads results, metrics, heartbeats and headers through a peer into a `Seen`
- `server.py`  a small HTTP server (the standard library's) that renders the watcher's board per request

`screenshot.png` is the page of a demo run, shown in the README.
"""
