//! Static file server with HTTP Range support (tower-http `ServeDir`) on 127.0.0.1, for the agent
//! throughput benchmark (`scripts/bench-cache.sh`): `range_server DIR PORT`.

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args.next().expect("usage: range_server DIR PORT");
    let port: u16 = args.next().expect("usage: range_server DIR PORT").parse().expect("PORT is a number");
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.expect("bind 127.0.0.1");
    let app = axum::Router::new().fallback_service(tower_http::services::ServeDir::new(dir));
    axum::serve(listener, app).await.expect("serve");
}
