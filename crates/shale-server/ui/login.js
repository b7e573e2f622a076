// The login page: checks the token against the API, then keeps it in a SameSite=Strict
// cookie for this browser session (the page reads it to sign its API calls).
"use strict";
document.getElementById("login").addEventListener("submit", async (event) => {
  event.preventDefault();
  const token = document.getElementById("token").value;
  const error = document.getElementById("login-error");
  error.hidden = true;
  try {
    const response = await fetch("/api/v1/version", { headers: { Authorization: `Bearer ${token}` } });
    if (!response.ok) {
      let message = `HTTP ${response.status}`;
      try { message = (await response.json()).message || message; } catch (_) { /* not JSON */ }
      throw new Error(message);
    }
    document.cookie = `shale_api_token=${encodeURIComponent(token)}; Path=/; SameSite=Strict`;
    window.location.assign("/ui");
  } catch (err) {
    error.textContent = err.message;
    error.hidden = false;
  }
});
