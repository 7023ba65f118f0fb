"""The dashboard's web face (`vpo ui`): the FastAPI app, its page and JSON routes, the guard that
keeps a loopback-only server loopback-only, and serving it. The data it shows: `dashboard`."""

from __future__ import annotations

import ipaddress
from importlib import resources
from typing import Any

from harness.config.errors import UserError
from harness.observation import views
from harness.observation.dashboard import CampaignView, Dashboard
from harness.observation.genealogy import DEFAULT_LIMIT, MAX_LIMIT, Trees
from harness.store import Store
from harness.store.models import MAX_ID

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


def is_loopback(host: str) -> bool:
    """Whether `host` (a name, an IPv4 or IPv6 address, bracketed or not) names this machine's
    loopback interface: localhost, any of 127.0.0.0/8, ::1 or ::ffff:127.x.y.z. Every such
    address reaches only local processes, so the dashboard treats them all alike."""
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host.rstrip(".") == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])  # drop an IPv6 zone (::1%lo)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # Python 3.11 calls ::ffff:127.0.0.1 not loopback
    return address.is_loopback


def request_host(header: str) -> str:
    """The host of a Host header, without its port: `[::1]:8300` -> `[::1]`."""
    header = header.strip()
    if header.startswith("["):
        return header[: header.find("]") + 1] if "]" in header else header
    if header.count(":") == 1:
        return header.split(":", 1)[0]
    return header  # no port, or a bare IPv6 address


def create_app(store: Store, *, local_only: bool = False) -> Any:
    """The FastAPI application: one page, its script and style, and JSON under /api.

    With `local_only`, a request whose Host header does not name a loopback address is
    refused: a web page elsewhere that points its own domain at 127.0.0.1 (DNS rebinding)
    cannot read the database through a local dashboard.

    Every parameter taken from the URL is checked before use; a bad one is a 4xx whose
    `detail` is one line (the page shows it as the error)."""
    from fastapi import FastAPI

    board = Dashboard(store)
    app = FastAPI(title="vpo-evolve", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.dashboard = board
    app.state.trees = Trees(store)
    _guard(app, local_only)
    _page_routes(app)
    _api_routes(app, board, store, app.state.trees)
    return app


def _guard(app: Any, local_only: bool) -> None:
    """Read-only, loopback-only when asked, strict headers, and one-line validation errors."""
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    @app.middleware("http")
    async def _headers(request: Request, call_next: Any) -> Any:
        if request.method not in ("GET", "HEAD"):
            return JSONResponse({"error": "the dashboard is read-only"}, status_code=405)
        if local_only:
            host = request_host(request.headers.get("host", ""))
            if not is_loopback(host):
                return JSONResponse({"error": f"unknown host {host!r}"}, status_code=400)
        response = await call_next(request)
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["Cache-Control"] = "no-store"
        return response

    @app.exception_handler(RequestValidationError)
    async def _bad_parameter(_request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own answer is a list of objects; the page shows `detail` as one line.
        errors = exc.errors()
        first = errors[0] if errors else {}
        where = ".".join(str(part) for part in first.get("loc", ())[1:]) or "request"
        message = " ".join(str(first.get("msg", "invalid parameter")).split())
        return JSONResponse({"detail": f"{where}: {message}"}, status_code=422)


def _page_routes(app: Any) -> None:
    from fastapi.responses import Response

    static = resources.files("harness.observation") / "ui"

    def _file(name: str, media: str) -> Response:
        return Response((static / name).read_bytes(), media_type=media)

    @app.get("/")
    def index() -> Response:
        return _file("index.html", "text/html; charset=utf-8")

    @app.get("/app.js")
    def script() -> Response:
        return _file("app.js", "text/javascript; charset=utf-8")

    @app.get("/app.css")
    def style() -> Response:
        return _file("app.css", "text/css; charset=utf-8")

    @app.get("/search.js")
    def search_script() -> Response:
        return _file("search.js", "text/javascript; charset=utf-8")

    @app.get("/search.css")
    def search_style() -> Response:
        return _file("search.css", "text/css; charset=utf-8")


def _api_routes(app: Any, board: Dashboard, store: Store, trees: Trees) -> None:
    from fastapi import HTTPException, Query
    from fastapi import Path as PathParameter

    # Ids past the largest SQLite integer cannot name a row; the driver would raise on them.
    campaign_id = Query(None, ge=1, le=MAX_ID)
    program_id_path = PathParameter(ge=1, le=MAX_ID)

    def _view(campaign: int | None) -> CampaignView:
        try:
            return board.view(campaign)
        except LookupError as exc:
            raise HTTPException(404, str(exc)) from None
        except UserError as exc:
            raise HTTPException(404, str(exc)) from None

    @app.get("/api/campaigns")
    def campaigns() -> list[dict[str, Any]]:
        return board.campaigns()

    @app.get("/api/overview")
    def overview(campaign: int | None = campaign_id) -> dict[str, Any]:
        return _view(campaign).overview()

    @app.get("/api/top")
    def top(
        campaign: int | None = campaign_id,
        objective: str | None = None,
        weights: str | None = None,
        n: int = Query(50, ge=1, le=500),
    ) -> list[dict[str, Any]]:
        view = _view(campaign)
        try:
            parsed = None if weights is None else [float(w) for w in weights.split(",")]
        except ValueError:
            raise HTTPException(
                400, f"weights must be numbers separated by commas: {weights!r}"
            ) from None
        try:
            return view.top(objective=objective, weights=parsed, n=n)
        except UserError as exc:
            raise HTTPException(400, str(exc)) from None

    @app.get("/api/programs/{program_id}")
    def program(program_id: int = program_id_path) -> dict[str, Any]:
        try:
            shown = views.show(store, program_id)
        except UserError as exc:
            raise HTTPException(404, str(exc)) from None
        shown["diff"] = (
            views.diff(store, program_id)["diff"] if shown["parent_id"] is not None else None
        )
        return shown

    @app.get("/api/tree")
    def tree(
        campaign: int | None = campaign_id,
        limit: int = Query(DEFAULT_LIMIT, ge=100, le=MAX_LIMIT),
    ) -> dict[str, Any]:
        return trees.get(_view(campaign).campaign.id).view(limit)

    @app.get("/api/programs/{program_id}/story")
    def story(program_id: int = program_id_path) -> dict[str, Any]:
        if store.program(program_id) is None:
            raise HTTPException(404, f"no program {program_id} in {store.where}")
        return {"program_id": program_id, "rollout": store.story(program_id)}

    @app.get("/api/programs/{program_id}/lineage")
    def lineage(program_id: int = program_id_path) -> dict[str, Any]:
        try:
            return views.lineage(store, program_id)
        except UserError as exc:
            raise HTTPException(404, str(exc)) from None


def serve(store: Store, host: str, port: int) -> None:
    """Run the dashboard until interrupted; a port in use is a one-line error."""
    import socket

    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise UserError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
        # The address actually bound, so a name (localhost, a hostname Debian maps to
        # 127.0.1.1) is judged by where it points, like an address.
        bound = str(probe.getsockname()[0])
    local = is_loopback(host) or is_loopback(bound)
    app = create_app(store, local_only=local)
    print(f"vpo ui: reading {store.where} ...", flush=True)
    app.state.dashboard.warm()
    app.state.trees.warm()
    shown = f"[{host}]" if ":" in host else host
    print(f"vpo ui: http://{shown}:{port}/  (read-only; Ctrl-C stops)", flush=True)
    if not local:
        print(
            f"vpo ui: listening on {host}: anyone who can reach this port can read the database",
            flush=True,
        )
    uvicorn.run(app, host=host, port=port, log_level="warning")
