"""The HTML report (`evaluate report`) and its charts, as SVG for the page and PNG for papers."""
