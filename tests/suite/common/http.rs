//! A real HTTP server on an ephemeral port of 127.0.0.1, and a real client.

use axum::Router;

/// Serves `router` on an ephemeral port of 127.0.0.1; its base URL
/// (`http://127.0.0.1:port`) and a client that follows no redirect.
pub async fn serve(router: Router) -> (String, reqwest::Client) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind an ephemeral port on 127.0.0.1");
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    (format!("http://{addr}"), client)
}
