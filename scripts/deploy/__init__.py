"""The deploy test (scripts/deploy_smoke.sh): the images built, the compose stack run with
podman-compose, the WeCom emulator talking to it through nginx (docs/deploy.md, "The deploy
test")."""
