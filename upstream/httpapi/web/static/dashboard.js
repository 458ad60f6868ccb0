// The dashboard's one script: the copy button of a new key. Every page works without
// it; the revocation's confirmation is a page of its own.
"use strict";
document.addEventListener("click", function (ev) {
	var button = ev.target.closest("button[data-copy]");
	if (!button) {
		return;
	}
	var source = document.getElementById(button.getAttribute("data-copy"));
	var status = document.querySelector("[data-copied]");
	function say(text) {
		if (status) {
			status.textContent = text;
		}
	}
	if (!source || !navigator.clipboard) {
		say("Select the key and copy it.");
		return;
	}
	navigator.clipboard.writeText(source.textContent).then(
		function () { say("Copied."); },
		function () { say("Select the key and copy it."); }
	);
});
