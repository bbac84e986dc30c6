#!/bin/bash
echo river > /workspace/draft.txt
