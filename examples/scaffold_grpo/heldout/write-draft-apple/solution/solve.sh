#!/bin/bash
echo apple > /workspace/draft.txt
